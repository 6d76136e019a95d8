"""The payload bucket: large payloads as S3 objects (docs/adr/0102-large-payloads.md).

Engine v3 stores a payload over ``OBJECT_PAYLOAD_BYTES`` (64 KiB) as an object under ``o/`` and
the row keeps its key; the functions find the bucket by ``QUERATOR_PAYLOAD_BUCKET`` and may act on
``o/*`` only, each with the actions ``infra.permissions.S3_ACTIONS`` lists for it.

Stateful like the tables: the construct ids ``Payloads`` and ``Bucket`` are never renamed (a new
logical id is a new, empty bucket, and the rows would name objects of the old one), and the bucket is
kept when the stack is deleted outside dev stages (``removal_policy``). In a dev stage it goes with
the stack only when empty: CDK's ``auto_delete_objects`` would add a Node.js custom resource (a
function with list and delete rights on the whole bucket, outside the permissions table) that
LocalStack's host executor (stage ``local``) and moto cannot run. Objects of items that ended are
deleted by the store and the reaper's sweep; none is kept past its item's row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aws_cdk import Duration
from aws_cdk import aws_s3 as s3
from constructs import Construct

from infra.constructs.common import removal_policy
from infra.nag import acknowledge

if TYPE_CHECKING:
    from infra.config import StageConfig

#: An upload the functions never finish (they upload in one request; a multipart upload is another
#: client's) is aborted after this long, so its parts stop costing.
ABORT_INCOMPLETE_UPLOADS: Final = Duration.days(1)


class PayloadBucket(Construct):
    """The bucket of payload objects: SSE-S3, no public access, TLS only, unversioned."""

    def __init__(self, scope: Construct, construct_id: str, *, config: StageConfig) -> None:
        super().__init__(scope, construct_id)
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            # Keys managed by S3 (SSE-S3): no key policy of ours, and no KMS request per object,
            # which a lease of many large items would pay for on every read.
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            # A bucket policy denying every request not over TLS (aws:SecureTransport false).
            enforce_ssl=True,
            # An object is written once and deleted when its item ends: old versions would keep
            # every deleted payload.
            versioned=False,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="abort-incomplete-uploads",
                    abort_incomplete_multipart_upload_after=ABORT_INCOMPLETE_UPLOADS,
                )
            ],
            removal_policy=removal_policy(config),
        )
        acknowledge(
            self.bucket,
            "AwsSolutions-S1",
            "Only the stack's function roles reach the objects (grants on o/* alone, public access "
            "blocked, TLS enforced); server access logs would need a second bucket and a line per "
            "object request. CloudTrail S3 data events record object access where an account wants it.",
        )

    @property
    def bucket_name(self) -> str:
        return self.bucket.bucket_name

    @property
    def bucket_arn(self) -> str:
        return self.bucket.bucket_arn
