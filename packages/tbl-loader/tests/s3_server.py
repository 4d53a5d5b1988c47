"""A real S3-compatible server on 127.0.0.1 for the remote tests: moto's ThreadedMotoServer, spoken to over HTTP.

``S3Server`` starts it on a free port; ``storage_options`` are what a user passes
for such an endpoint. Tests that need it skip when the ``remote`` extra or
``moto[server]`` is missing (CI installs both: noxfile.py).
"""

from __future__ import annotations

import logging
import socket
import uuid
from datetime import timedelta

import pytest

ACCESS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self) -> None:
        pytest.importorskip("obstore", reason='the remote extra is not installed (pip install "tbl-loader[remote]")')
        pytest.importorskip("filelock", reason='the remote extra is not installed (pip install "tbl-loader[remote]")')
        server = pytest.importorskip("moto.server", reason='moto[server] is not installed (pip install "moto[server]")')
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = server.ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    @property
    def storage_options(self) -> dict:
        return {**ACCESS, "endpoint": self.endpoint, "client_options": {"allow_http": True},
                "retry_config": {"max_retries": 1, "retry_timeout": timedelta(seconds=2),
                                 "backoff": {"init_backoff": timedelta(milliseconds=10),
                                             "max_backoff": timedelta(milliseconds=50)}}}

    def boto(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def new_bucket(self) -> str:
        name = f"b-{uuid.uuid4().hex[:12]}"
        self.boto().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        self._server.stop()
