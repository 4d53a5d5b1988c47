"""Where `tbl convert` finds images and their labels: a TAR, a folder tree, or a list.

Every source becomes a `Listing`: samples in a fixed order, each with a name
(for reports), an integer label and a locator (a file path, or the offset and
size of a member in a plain TAR read with `TarReader`), plus the class names
(label i is ``classes[i]``).

Sources and their rules
-----------------------
Folder tree (torchvision ImageFolder layout)
    ``root/<class>/**/<image>``: every first-level subfolder of ``root`` is a
    class; classes are the sorted folder names (Python ``str`` order) and a
    label is the index of its class, exactly as ImageFolder assigns them.
    A class folder without images is refused by `tbl convert`
    (`EmptyClassError`, naming the folder) unless ``allow_empty_classes``:
    then it keeps its index (class names always come from the whole source)
    and the listing's ``empty_classes`` names it. Images are found recursively.
    Files directly in ``root`` are ignored, and so are hidden folders such as
    ``.ipynb_checkpoints`` (ImageFolder would count them as classes).
TAR (ImageNet layout)
    Plain or compressed (gzip, bzip2, xz; detected from the first bytes, not
    the file name). Each image member's class is the name of the folder that
    directly contains it: ``n01440764/x.JPEG`` and ``train/n01440764/x.JPEG``
    both give class ``n01440764``. Classes are sorted, labels are indices. An
    image at the TAR root needs a label file. A name stored twice (an appended
    TAR) means its last copy, as ``tar x`` would extract it. A compressed TAR is first
    decompressed once into a temporary plain TAR (JPEGs do not compress, so it
    is about the size of the source) because the sorted order needs random
    access; it is deleted when the conversion ends (only a process killed
    outright can leave it behind, as ``.tbl-convert-*.tar`` in the scratch
    directory: for `tbl convert`, the destination's directory).
Label file (``label_file=``, for a flat TAR or folder, or to override folders)
    Text, one ``name<SEP>label`` row per image, ``SEP`` a tab if the first data
    row contains one, else a comma (CSV quoting rules). ``name`` is the image's
    path relative to the TAR / folder root, ``/``-separated (``img1.jpg``,
    ``val/img1.jpg``). Blank rows and rows starting with ``#`` are skipped; an
    optional first row ``filename,label`` (or ``path,label``) is a header. If
    every label is a non-negative integer, labels are used as given and the
    class names are ``"0" .. str(max)``; otherwise every label is a class name,
    class names are sorted and labels are their indices. Every listed name
    must exist in the source; images present but not listed are ignored.
List of ``(path, label)`` pairs (Python API only)
    Labels follow the label-file rule (all non-negative integers or digit
    strings: used as given; otherwise all class-name strings: sorted, label =
    index). Kept in the given order.

Order: TAR and folder samples are sorted by their relative name (Python
``str`` order), so the order never depends on the TAR's member order or the
file system's listing order. A list keeps the order it was given in.

Symbolic links in a folder source are followed wherever they point (in the
tree or out of it: targets are only read), with two guards so that a listing
always ends and never holds a file twice. Each real directory (by
``(st_dev, st_ino)``) is walked once: the root and the class folders first,
then in walk order (entries sorted by name); a link to a directory already
walked, a symlink loop included, is not followed and is listed in
`Listing.skipped`. Each real file is stored once: when several names reach
the same file (links, hard links), the first name in the sorted order is kept
and the others are listed in `Listing.skipped`. A folder that cannot be
listed (permission denied) is skipped the same way, never silently.

Only regular files are ever opened. An entry with an image name that is not
a regular file (a FIFO, a socket, a device node, a link to one, a broken
link) is still a sample of the listing: reading it fails without opening it
(`NotRegularFileError`), so it is a bad image that follows ``on_error``, named
in the report. A source (TAR, folder, label file) that is not a regular file
or directory is refused with `SourceError`. An image larger than
``max_bytes`` (a huge or sparse file, a huge TAR member) is refused the same
way (`ImageTooLargeError`) before any of it is read.

Only files with an image extension are taken (case-insensitive:
``IMG_EXTENSIONS``, the torchvision list); hidden files and folders (name
starting with ``.``, e.g. macOS ``._x.jpg``) and non-regular TAR members are
ignored. Ignored files are counted in `Listing.ignored`, never silently
converted or dropped from the count.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import lzma
import os
import re
import stat
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import numpy as np

import tbl_format

from ..errors import EmptyClassError, ImageTooLargeError, NotRegularFileError, SourceError

__all__ = [
    "DEFAULT_MAX_IMAGE_BYTES",
    "IMG_EXTENSIONS",
    "Listing",
    "TarReader",
    "check_empty_classes",
    "labels_from_values",
    "open_regular",
    "open_source",
    "parse_label_file",
    "read_file",
]

IMG_EXTENSIONS: Final = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# Encoded bytes of one image, at most: far above any real photo, far below what would exhaust memory.
DEFAULT_MAX_IMAGE_BYTES: Final = 256 << 20
# A label file is read whole: ImageNet's is about 40 MB.
LABEL_FILE_MAX_BYTES: Final = 1 << 30

# First bytes of each compression a TAR may come in, and how to stream-decompress it.
_COMPRESSIONS: Final = (
    (b"\x1f\x8b", "gzip", gzip.open),
    (b"BZh", "bzip2", bz2.open),
    (b"\xfd7zXZ\x00", "xz", lzma.open),
)


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """Open a regular file for reading: (fd, fstat). Anything else raises NotRegularFileError unopened
    (``tbl_format.open_regular``: stat first, then a non-blocking open checked again)."""
    try:
        fd = tbl_format.open_regular(path, "image")
    except tbl_format.NotRegularFileError as e:
        raise NotRegularFileError(f"{e}: never opened") from None
    return fd, os.fstat(fd)


def _too_large(size: int, cap: int) -> ImageTooLargeError:
    return ImageTooLargeError(f"{size} bytes or more, over the {cap}-byte cap on one image (max_image_bytes)")


def _read_capped(fd: int, size_hint: int, cap: int) -> bytes:
    """All of fd's bytes, never holding more than ``cap + 1`` of them; ImageTooLargeError beyond ``cap``."""
    parts: list[bytes] = []
    total = 0
    ask = min(size_hint, cap) + 1  # one read of the stated size; the +1 sees a file that grew since fstat
    while True:
        chunk = os.read(fd, ask)
        if not chunk:
            return b"".join(parts)  # one part (the usual case) is returned as it is, not copied
        parts.append(chunk)
        total += len(chunk)
        if total > cap:
            raise _too_large(total, cap)
        ask = min(1 << 20, cap + 1 - total)


# A locator is either a file path (folder / list sources) or (offset, size) of
# a member's data inside the plain TAR named by `Listing.tar_path`.
Locator = str | tuple[int, int]


@dataclass
class Listing:
    """A source's samples in conversion order."""

    kind: str  # "tar", "folder", "list", or a record source (`tbl_loader.conversion.records`)
    names: list[str]
    labels: list[int]
    locators: list[Locator]
    classes: list[str]
    tar_path: str | None = None  # plain TAR (or scratch file of a record source) the (offset, size) locators point into
    compression: str | None = None  # compression of the original TAR, if any
    ignored: list[str] = field(default_factory=list)
    # (name, why): folders not walked (a link to a folder already walked, a loop, unreadable) and
    # second names of a file already listed
    skipped: list[tuple[str, str]] = field(default_factory=list)
    # class folders (folder sources) in which no image was listed; they keep their label index
    empty_classes: list[str] = field(default_factory=list)
    root: str | None = None  # the folder source's root (names the empty class folders)
    # a record source's own fields: {name: {field: value}} (stored as the sidecar's are)
    fields: dict[str, dict[str, Any]] | None = None

    def __len__(self) -> int:
        return len(self.names)


def check_empty_classes(listing: Listing, allow_empty_classes: bool) -> None:
    """Raise `EmptyClassError` naming every empty class folder, unless they are allowed."""
    empty = listing.empty_classes
    if not empty or allow_empty_classes:
        return
    root = Path(listing.root or ".")
    shown = ", ".join(repr(str(root / c)) for c in empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
    raise EmptyClassError(
        f"{len(empty)} class folder(s) hold no image: {shown}; remove them, or pass --allow-empty-classes "
        f"(allow_empty_classes=True) to keep each as an empty class with its label index"
    )


def _is_image_name(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def _is_hidden(rel: str) -> bool:
    """A part of the /-separated path starts with a dot (the same test as on each part, without splitting)."""
    return rel.startswith(".") or "/." in rel


def parse_label_file(path: str | os.PathLike[str]) -> tuple[dict[str, int], list[str]]:
    """Read a label file (see module docstring) into ``{name: label}`` and class names."""
    path = Path(path)
    try:
        fd, st = open_regular(path)
        try:
            raw_bytes = _read_capped(fd, st.st_size, LABEL_FILE_MAX_BYTES)
        finally:
            os.close(fd)
        text = raw_bytes.decode("utf-8-sig")
    except (OSError, ValueError, NotRegularFileError) as e:
        raise SourceError(f"cannot read label file {str(path)!r}: {e}") from e
    rows = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip() and not line.startswith("#")]
    if not rows:
        raise SourceError(f"label file {str(path)!r} has no rows")
    delimiter = "\t" if "\t" in rows[0][1] else ","
    entries: list[tuple[str, str, int]] = []
    for (lineno, _), fields in zip(rows, csv.reader([line for _, line in rows], delimiter=delimiter), strict=True):
        if len(fields) != 2:
            raise SourceError(
                f"label file {str(path)!r} line {lineno}: expected 2 fields (name{delimiter!r}label), got {len(fields)}"
            )
        entries.append((fields[0].strip(), fields[1].strip(), lineno))
    first_name, first_label, _ = entries[0]
    if first_name.lower() in ("filename", "path") and first_label.lower() == "label":
        entries = entries[1:]
    if not entries:
        raise SourceError(f"label file {str(path)!r} has a header but no rows")
    seen: dict[str, int] = {}
    for name, _, lineno in entries:
        if not name:
            raise SourceError(f"label file {str(path)!r} line {lineno}: empty name")
        if name in seen:
            raise SourceError(f"label file {str(path)!r} line {lineno}: {name!r} already listed on line {seen[name]}")
        seen[name] = lineno
    raw = {name: label for name, label, _ in entries}
    labels, classes = labels_from_values(list(raw.values()), what=f"label file {str(path)!r}")
    return dict(zip(raw, labels, strict=True)), classes


def labels_from_values(values: Sequence[object], *, what: str) -> tuple[list[int], list[str]]:
    """All non-negative integers (ints or digit strings): used as given, class names "0".."max".
    Otherwise all must be strings: class names, sorted, label = index."""
    ints: list[int] = []
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool):
            ints.append(v)
        elif isinstance(v, str) and v.isascii() and v.isdigit():
            ints.append(int(v))
        else:
            break
    else:
        if any(i < 0 for i in ints):
            raise SourceError(f"{what}: negative label {min(ints)}")
        return ints, [str(i) for i in range(max(ints, default=-1) + 1)]
    names: list[str] = []
    for v in values:
        if not isinstance(v, str):
            raise SourceError(f"{what}: labels must be all integers or all class-name strings, got {v!r}")
        names.append(v)
    classes = sorted(set(names))
    index = {c: i for i, c in enumerate(classes)}
    return [index[v] for v in names], classes


def _apply_label_file(
    names: list[str], locators: list[Locator], label_file: str | os.PathLike[str], ignored: list[str]
) -> tuple[list[str], list[int], list[Locator], list[str]]:
    table, classes = parse_label_file(label_file)
    present = dict(zip(names, locators, strict=True))
    missing = [n for n in table if n not in present]
    if missing:
        shown = ", ".join(repr(n) for n in missing[:5])
        raise SourceError(
            f"label file {str(label_file)!r} lists {len(missing)} image(s) not in the source "
            f"(names are paths relative to the source root): {shown}"
        )
    ignored.extend(n for n in names if n not in table)
    kept = sorted(table)
    return kept, [table[n] for n in kept], [present[n] for n in kept], classes


def _open_source_file(path: Path) -> IO[bytes]:
    try:
        fd, _ = open_regular(path)
    except NotRegularFileError as e:
        raise SourceError(f"source {str(path)!r}: {e}") from e
    return os.fdopen(fd, "rb")


def _sniff_compression(path: Path) -> tuple[str | None, Callable[..., IO[bytes]] | None]:
    with _open_source_file(path) as f:
        head = f.read(6)
    for magic, name, opener in _COMPRESSIONS:
        if head.startswith(magic):
            return name, opener
    return None, None


_TAR_BLOCK = 512
_ZERO_BLOCK = bytes(_TAR_BLOCK)
_USTAR_MAGICS = (b"ustar\x0000", b"ustar  \x00")  # POSIX ustar, GNU
_TAR_REGULAR = (b"0", b"\x00", b"7")  # regular, old regular, contiguous
_TAR_OTHER = (b"1", b"2", b"3", b"4", b"5", b"6")  # hard link, symlink, devices, directory, FIFO: no data blocks


_ASCII_SPACE = b" \t\n\r\x0b\x0c"  # bytes.strip's set
# An octal header field as tarfile accepts it from a plain header: up to the first NUL, octal digits between
# ASCII white space; an empty field is 0.
_SPACES = b"[" + re.escape(_ASCII_SPACE) + b"]*"
_OCTAL_FIELD = re.compile(_SPACES + rb"([0-7]*)" + _SPACES + rb"(?:\x00.*)?", re.DOTALL)
_FS_CODEC = (sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())  # os.fsdecode's, looked up once


def _octal(field: bytes) -> int | None:
    match = _OCTAL_FIELD.fullmatch(field)
    if match is None:
        return None
    return int(match[1] or b"0", 8)


def _fsdecode(field: bytes) -> str:
    """A NUL-terminated name field as os.fsdecode decodes it."""
    end = field.find(b"\x00")
    return (field if end < 0 else field[:end]).decode(*_FS_CODEC)


def _scan_plain_tar(fd: int, file_size: int) -> list[tuple[str, bool, bool, int, int]] | None:
    """(name, is_dir, is_regular, data offset, size) of every member, when every header is a plain ustar / GNU
    one (no pax or GNU long-name records, no sparse members or base-256 sizes, checksums right, every number
    field one tarfile reads, nothing truncated).

    Names and kinds are what `tarfile` makes of such headers. None when a header is not that simple: the
    caller then lists the whole TAR with `tarfile` itself, so anything unusual keeps its exact `tarfile`
    reading (and its errors). About 10x faster than `tarfile` on a TAR of photos.
    """
    out: list[tuple[str, bool, bool, int, int]] = []
    headers: list[bytes] = []
    stored: list[int] = []  # each header's checksum field, checked against its bytes at the end, all at once
    pos = 0
    while pos < file_size:
        block = os.pread(fd, _TAR_BLOCK, pos)
        if len(block) < _TAR_BLOCK:
            return None
        if block == _ZERO_BLOCK:
            if not pos:
                return None  # an empty TAR: left to tarfile
            break  # the end-of-archive marker
        if block[257:265] not in _USTAR_MAGICS or block[124] & 0x80:
            return None
        checksum = _octal(block[148:156])
        if checksum is None:
            return None
        headers.append(block)
        stored.append(checksum)
        kind = block[156:157]
        size = _octal(block[124:136])
        if size is None:
            return None
        name = _fsdecode(block[:100])
        if kind == b"\x00" and name.endswith("/"):
            kind = b"5"
        regular = kind in _TAR_REGULAR
        if not regular and kind not in _TAR_OTHER:
            return None  # pax, GNU long name, sparse, volume label...: tarfile reads those
        is_dir = kind == b"5"
        if is_dir:
            name = name.rstrip("/")
        if block[345]:  # a ustar name prefix
            name = _fsdecode(block[345:500]) + "/" + name
        data = pos + _TAR_BLOCK
        if regular:
            if data + size > file_size:
                return None  # truncated: tarfile says so
            pos = data + -(-size // _TAR_BLOCK) * _TAR_BLOCK
        else:
            pos = data
        out.append((name, is_dir, regular, data, size))
    return out if _headers_sound(headers, stored) else None


# The number fields the listing does not use but tarfile parses all the same (it refuses a header where one
# is not a number): mode, uid, gid, mtime, devmajor, devminor.
_UNREAD_NUMBER_FIELDS = ((100, 108), (108, 116), (116, 124), (136, 148), (329, 337), (337, 345))
_WIDEST_FIELD = 12
_IS_OCTAL_DIGIT = np.zeros(256, bool)
_IS_OCTAL_DIGIT[ord("0") : ord("7") + 1] = True
_IS_ASCII_SPACE = np.zeros(256, bool)
_IS_ASCII_SPACE[list(_ASCII_SPACE)] = True


def _headers_sound(headers: list[bytes], stored: list[int]) -> bool:
    """Every header as tarfile would take it: checksum right, number fields numbers. Checked for all headers
    at once (a Python sum over each header was half the listing's time). A header read after a damaged one
    may be garbage; the damaged one fails here all the same, and the listing is left to tarfile.
    """
    if not headers:
        return True
    blocks = np.frombuffer(b"".join(headers), np.uint8).reshape(len(headers), _TAR_BLOCK)
    # The stored checksum is the sum of the header's bytes with the checksum field counted as 8 spaces.
    sums = blocks.sum(axis=1, dtype=np.int64) - blocks[:, 148:156].sum(axis=1, dtype=np.int64) + 8 * 32
    if not np.array_equal(sums, np.array(stored, np.int64)):
        return False
    # Byte j of every field in row j (each field NUL-padded to the widest: a NUL past its end reads as its
    # end), so that the check below walks 12 rows of all fields at once.
    fields = np.zeros((_WIDEST_FIELD, len(_UNREAD_NUMBER_FIELDS), len(headers)), np.uint8)
    for k, (start, end) in enumerate(_UNREAD_NUMBER_FIELDS):
        fields[: end - start, k] = blocks[:, start:end].T
    return _plain_numbers(fields.reshape(_WIDEST_FIELD, -1))


def _plain_numbers(columns: np.ndarray) -> bool:
    """Each column (one field, byte j in row j) is base-256 (first byte 0x80 / 0xFF) or, up to its first NUL,
    what `_OCTAL_FIELD` matches: space, octal digits, space. tarfile reads all of these; what else it reads
    (a sign, an underscore, other white space) is left to it by answering False."""
    width, count = columns.shape
    ended = np.zeros(count, bool)  # a NUL seen: the rest of the field is not read
    digits = np.zeros(count, bool)  # a digit seen
    closed = np.zeros(count, bool)  # a space seen after digits: no digit may follow
    bad = np.zeros(count, bool)
    for j in range(width):
        byte = columns[j]
        ended |= byte == 0
        digit = _IS_OCTAL_DIGIT[byte] & ~ended
        space = _IS_ASCII_SPACE[byte] & ~ended
        bad |= ~ended & ~digit & ~space | digit & closed
        digits |= digit
        closed |= space & digits
    base256 = (columns[0] == 0x80) | (columns[0] == 0xFF)
    return bool((~bad | base256).all())


def _scan_tar(tar_path: Path) -> tuple[list[str], list[Locator], list[str]]:
    """Regular image members of a plain TAR: names, (offset, size), ignored names. Later duplicates win."""
    with _open_source_file(tar_path) as f:
        plain = _scan_plain_tar(f.fileno(), os.fstat(f.fileno()).st_size)
    if plain is None:
        return _scan_tar_with_tarfile(tar_path)
    members: dict[str, tuple[int, int]] = {}
    ignored: list[str] = []
    for name, is_dir, regular, offset, size in plain:
        while name.startswith("./"):
            name = name[2:]
        if is_dir:
            continue
        if not regular or _is_hidden(name) or not _is_image_name(name):
            ignored.append(name)
            continue
        members[name] = (offset, size)
    names = sorted(members)
    return names, [members[n] for n in names], ignored


def _scan_tar_with_tarfile(tar_path: Path) -> tuple[list[str], list[Locator], list[str]]:
    """`_scan_tar` for any TAR `tarfile` reads (pax and GNU extensions, sparse members)."""
    members: dict[str, tuple[int, int]] = {}
    ignored: list[str] = []
    try:
        with _open_source_file(tar_path) as f, tarfile.open(fileobj=f, mode="r:") as tf:
            while (m := tf.next()) is not None:
                # TarFile keeps every TarInfo it reads (~1 KB each): drop them, only offsets are needed.
                tf.members.clear()
                name = m.name
                while name.startswith("./"):
                    name = name[2:]
                if m.isdir():
                    continue
                if not m.isreg() or m.sparse is not None or _is_hidden(name) or not _is_image_name(name):
                    ignored.append(name)
                    continue
                members[name] = (m.offset_data, m.size)
    except tarfile.TarError as e:
        raise SourceError(f"{str(tar_path)!r} is not a readable TAR: {e}") from e
    names = sorted(members)
    return names, [members[n] for n in names], ignored


def _tar_listing(tar_path: Path, label_file: str | os.PathLike[str] | None) -> Listing:
    names, locators, ignored = _scan_tar(tar_path)
    if label_file is not None:
        names, labels, locators, classes = _apply_label_file(names, locators, label_file, ignored)
    else:
        rooted = [n for n in names if "/" not in n]
        if rooted:
            raise SourceError(
                f"TAR {str(tar_path)!r}: image {rooted[0]!r} is at the TAR root; an ImageNet-layout TAR "
                f"needs one folder per class (class_name/x.JPEG), or give a label file"
            )
        parents = [n.rsplit("/", 2)[-2] for n in names]
        classes = sorted(set(parents))
        index = {c: i for i, c in enumerate(classes)}
        labels = [index[p] for p in parents]
    return Listing("tar", names, labels, locators, classes, tar_path=str(tar_path), ignored=ignored)


def _dir_key(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _walk_images(
    root: Path,
    start: str,
    walked: dict[tuple[int, int], str],
    ignored: list[str],
    skipped: list[tuple[str, str]],
) -> list[tuple[str, tuple[int, int] | None]]:
    """(relative '/'-name, (st_dev, st_ino) or None) of image files under ``root/start``, unsorted.

    Links are followed, but a directory whose (st_dev, st_ino) is in ``walked`` (walked already, or
    registered by the caller) is not entered again: that is what ends a symlink loop. Entries are
    visited in name order, so which of two links to one directory is walked does not depend on the
    file system's listing order.
    """
    found: list[tuple[str, tuple[int, int] | None]] = []
    stack = [start]
    while stack:
        rel_dir = stack.pop()
        prefix = rel_dir + "/" if rel_dir else ""
        try:
            with os.scandir(root / rel_dir if rel_dir else root) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            skipped.append((prefix or "./", f"cannot list this folder: {e.strerror or e}"))
            continue
        subdirs: list[str] = []
        for e in entries:
            rel = prefix + e.name
            is_dir = e.is_dir()  # follows links; False for a broken link or a link loop (then: a file)
            if e.name.startswith("."):
                ignored.append(rel + "/" if is_dir else rel)
            elif is_dir:
                st = e.stat()  # cached by is_dir
                key = (st.st_dev, st.st_ino)
                first = walked.get(key)
                if first is None:
                    walked[key] = rel
                    subdirs.append(rel)
                elif first == "" or rel.startswith(first + "/"):
                    skipped.append((rel + "/", f"symlink loop: the same folder as its parent {first or '.'!r}"))
                else:
                    skipped.append((rel + "/", f"the same folder as {first + '/'!r}, listed there"))
            elif not _is_image_name(e.name):
                ignored.append(rel)
            else:
                try:
                    fst = e.stat()
                    found.append((rel, (fst.st_dev, fst.st_ino)))
                except OSError:  # a broken link, a loop: kept as a sample, whose read then says why
                    found.append((rel, None))
        stack.extend(reversed(subdirs))
    return found


def _one_name_per_file(
    found: list[tuple[str, tuple[int, int] | None]], skipped: list[tuple[str, str]]
) -> list[str]:
    """Names sorted; of several names of one real file only the first is kept, the others are skipped."""
    first: dict[tuple[int, int], str] = {}
    names: list[str] = []
    for name, key in sorted(found, key=lambda x: x[0]):
        if key is not None:
            if key in first:
                skipped.append((name, f"the same file as {first[key]!r}, stored once"))
                continue
            first[key] = name
        names.append(name)
    return names


def _folder_listing(root: Path, label_file: str | os.PathLike[str] | None) -> Listing:
    ignored: list[str] = []
    skipped: list[tuple[str, str]] = []
    walked = {_dir_key(root): ""}
    if label_file is not None:
        names = _one_name_per_file(_walk_images(root, "", walked, ignored, skipped), skipped)
        locators: list[Locator] = [str(root / n) for n in names]
        names, labels, locators, classes = _apply_label_file(names, locators, label_file, ignored)
        return Listing("folder", names, labels, locators, classes, ignored=ignored, skipped=skipped)
    entries = sorted(os.scandir(root), key=lambda e: e.name)
    classes = [e.name for e in entries if e.is_dir() and not e.name.startswith(".")]
    if not classes:
        raise SourceError(
            f"folder {str(root)!r} has no class subfolders (expected root/<class>/<image>); "
            f"for a flat folder give a label file"
        )
    for e in entries:
        if not e.is_dir():
            ignored.append(e.name)
        elif e.name.startswith("."):
            ignored.append(e.name + "/")
    # Every class folder is registered before any is walked: a link inside one class to another
    # class's folder (or to the root) is a link to a folder listed on its own, never a second label.
    to_walk = []
    for cls in classes:
        key = _dir_key(root / cls)
        if key in walked:
            skipped.append((cls + "/", f"the same folder as {walked[key] + '/' if walked[key] else '.'!r}; "
                                       f"this class stays empty"))
        else:
            walked[key] = cls
            to_walk.append(cls)
    found: list[tuple[str, tuple[int, int] | None]] = []
    for cls in to_walk:
        found.extend(_walk_images(root, cls, walked, ignored, skipped))
    names = _one_name_per_file(found, skipped)
    index = {c: i for i, c in enumerate(classes)}
    labels = [index[n.split("/", 1)[0]] for n in names]
    used = set(labels)
    empty = [c for i, c in enumerate(classes) if i not in used]
    return Listing("folder", names, labels, [str(root / n) for n in names], classes, ignored=ignored, skipped=skipped,
                   empty_classes=empty, root=str(root))


def _list_listing(pairs: Sequence[object]) -> Listing:
    names: list[str] = []
    values: list[object] = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise SourceError(f"source list item {i} must be a (path, label) pair, got {pair!r}")
        p, label = pair
        if not isinstance(p, (str, os.PathLike)):
            raise SourceError(f"source list item {i}: path must be str or PathLike, got {type(p).__name__}")
        names.append(os.fspath(p))
        values.append(label)
    labels, classes = labels_from_values(values, what="source list")
    # Absolute locators: worker processes need not share the caller's working directory.
    return Listing("list", names, labels, [os.path.abspath(n) for n in names], classes)


def _decompress_to(path: Path, compression: str, opener: Callable[..., IO[bytes]], out_path: str) -> None:
    """Decompress into out_path. A bad stream is the source's fault (SourceError); a failed write (a full
    disk) is an OSError of the scratch file."""
    with _open_source_file(path) as raw, opener(raw, "rb") as comp, open(out_path, "wb") as out:
        while True:
            try:
                chunk = comp.read(1 << 20)
            except (OSError, EOFError, lzma.LZMAError) as e:
                raise SourceError(f"cannot decompress {compression} source {str(path)!r}: {e}") from e
            if not chunk:
                return
            out.write(chunk)


@contextmanager
def open_source(
    src: str | os.PathLike[str] | Sequence[object],
    *,
    label_file: str | os.PathLike[str] | None = None,
    scratch_dir: str | os.PathLike[str] | None = None,
) -> Iterator[Listing]:
    """List a source (see module docstring). A compressed TAR is decompressed into
    ``scratch_dir`` (default: the system temp dir) for the duration of the block."""
    scratch: str | None = None
    try:
        if not isinstance(src, (str, os.PathLike)):
            if label_file is not None:
                raise SourceError("label_file applies to a TAR or folder source, not to a list of (path, label)")
            listing = _list_listing(list(src))
            where = "source list"
        else:
            where = f"source {os.fspath(src)!r}"
            path = Path(os.path.abspath(src))  # worker processes need not share our working directory
            try:
                st = os.stat(path)
            except FileNotFoundError:
                raise SourceError(f"{where} does not exist") from None
            except OSError as e:  # a link loop, a parent that is a file, no permission
                raise SourceError(f"{where}: {e.strerror or e}") from e
            if stat.S_ISDIR(st.st_mode):
                try:
                    listing = _folder_listing(path, label_file)
                except OSError as e:  # the root or a class folder cannot be listed (a subfolder is skipped)
                    raise SourceError(f"{where}: {e}") from e
            elif not stat.S_ISREG(st.st_mode):
                raise SourceError(f"{where} is {tbl_format.file_kind(st.st_mode)}; a source is a TAR file or a folder")
            else:
                compression, opener = _sniff_compression(path)
                if compression is None:
                    listing = _tar_listing(path, label_file)
                else:
                    fd, scratch = tempfile.mkstemp(prefix=".tbl-convert-", suffix=".tar", dir=scratch_dir)
                    os.close(fd)
                    scratch = os.path.abspath(scratch)
                    _decompress_to(path, compression, opener, scratch)
                    listing = _tar_listing(Path(scratch), label_file)
                    listing.compression = compression
        if not listing.names:
            raise SourceError(f"{where} contains no images ({len(listing.ignored)} files ignored)")
        yield listing
    finally:
        if scratch is not None:
            os.unlink(scratch)


def read_file(path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (NotRegularFileError, ImageTooLargeError)."""
    fd, st = open_regular(path)
    try:
        if st.st_size > max_bytes:  # a huge or sparse file: refused without reading any of it
            raise _too_large(st.st_size, max_bytes)
        return _read_capped(fd, st.st_size, max_bytes)
    finally:
        os.close(fd)


class TarReader:
    """Reads members of a plain TAR by (offset, size) with positioned reads (no shared file offset)."""

    def __init__(self, tar_path: str, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> None:
        self._fd, _ = open_regular(tar_path)
        self.max_bytes = max_bytes

    def read(self, offset: int, size: int) -> bytes:
        if size > self.max_bytes:
            raise _too_large(size, self.max_bytes)
        data = os.pread(self._fd, size, offset)
        if len(data) != size:
            raise OSError(f"TAR member at offset {offset} is truncated: read {len(data)} of {size} bytes")
        return data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
