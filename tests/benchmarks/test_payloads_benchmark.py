"""The large-payload benchmark's core on a tiny workload: a payload over a row's is one S3 object,
put once, read at each lease, deleted at the end; one up to a row's makes no S3 request
(docs/adr/0102-large-payloads.md)."""

from __future__ import annotations

import pytest

from benchmarks.payloads import HAPPY, PHASES, ROUND, format_report, measure, sqs_requests
from querator.domain.model import MAX_PAYLOAD_BYTES, ROW_PAYLOAD_BYTES
from querator.storage.dynamodb.objects import OBJECT_PAYLOAD_BYTES

pytestmark = pytest.mark.server


def test_sqs_bills_a_request_per_64_kb_chunk() -> None:
    assert sqs_requests(1_000) == {"send": 1, "receive": 1, "delete": 1}
    assert sqs_requests(ROW_PAYLOAD_BYTES) == {"send": 6, "receive": 6, "delete": 1}
    assert sqs_requests(MAX_PAYLOAD_BYTES) == {"send": 16, "receive": 16, "delete": 1}
    # A batch is billed on its size: three 1,000 B messages are one 64 KB chunk.
    assert sqs_requests(1_000, 3) == pytest.approx({"send": 1 / 3, "receive": 1 / 3, "delete": 1 / 3})


def test_only_a_payload_over_64_kib_goes_to_the_bucket_and_none_is_left(moto_server: str) -> None:
    with pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            patch.setenv(name, "testing")
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        cases = measure(
            moto_server,
            sizes=(1_000, OBJECT_PAYLOAD_BYTES, ROW_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES),
            batches=(2,),
            count=2,
        )

    small, row, mid, big = cases
    for case in cases:
        assert case.objects_left == 0, case.name
    for case in (small, row):  # unchanged: the payload in its row, no S3 request at all
        for phase in PHASES:
            assert sum(case.s3[phase].values()) == 0, (case.name, phase)
    assert row.write_units["produce"] > 60  # a 64 KiB row: a write unit per KB
    # 380,000 B: in the bucket, so its row costs what a small item's does.
    assert mid.s3_of(HAPPY, "PutObject") == 1 and mid.write_units["produce"] < 10

    assert big.s3["produce"]["PutObject"] == 1
    assert big.s3_of(HAPPY, "PutObject") == 1
    for phase in ("lease", "dl:lease", "dl:lease2"):
        assert big.s3[phase]["GetObject"] >= 1, phase
    # The dead letter lives longer than the queue's items: its object is copied to a later key.
    assert big.s3_of(ROUND, "CopyObject") == 1
    assert big.s3["complete"]["DeleteObjects"] > 0 and big.s3["dl:complete"]["DeleteObjects"] > 0
    # The row holds the object's key, not the 1 MiB (which would be 1,024 write units a write).
    assert big.row_bytes < 1_000
    assert big.write_units["produce"] < 10
    assert big.dollars()["s3"] > 0 and small.dollars()["s3"] == 0

    report = format_report(cases)
    assert "1048576B x2" in report and "SQS Extended Client" in report
