"""The payload bucket: encrypted, private, TLS only, unversioned, kept with the tables outside dev; its
name reaches exactly the functions ``infra.permissions.S3_ACTIONS`` lists, each granted exactly
those actions on the objects' prefix (and the reaper a listing of that prefix alone)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Template

from infra.config import StageConfig
from infra.constructs.payloads import PayloadBucket
from infra.permissions import (
    FUNCTION_NAMES,
    PAYLOAD_PREFIX,
    REAPER,
    S3_ACTIONS,
    S3_BUCKET_ACTIONS,
    S3_OBJECT_ACTIONS,
)
from querator.config import EnvVar
from querator.storage.dynamodb.objects import PREFIX

if TYPE_CHECKING:
    from tests.infra.synth import Synth

pytestmark = pytest.mark.infra


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _bucket(synth: Synth) -> tuple[str, dict[str, Any]]:
    (found,) = synth.of_type("AWS::S3::Bucket").items()
    return found


def _arn(synth: Synth) -> dict[str, Any]:
    return {"Fn::GetAtt": [_bucket(synth)[0], "Arn"]}


def _objects(synth: Synth) -> dict[str, Any]:
    return {"Fn::Join": ["", [_arn(synth), f"/{PREFIX}*"]]}


def _s3_statements(synth: Synth, name: str) -> list[dict[str, Any]]:
    """The function's role's statements with any ``s3:`` action (none may mix in other services)."""
    role = synth.logical_id(synth.stack.functions[name].role)
    found = []
    for policy in synth.of_type("AWS::IAM::Policy").values():
        if {"Ref": role} not in policy["Properties"]["Roles"]:
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = _as_list(statement["Action"])
            if any(a.lower().startswith("s3:") for a in actions):
                assert all(a.startswith("s3:") for a in actions), statement
                found.append(statement)
    return found


def test_the_bucket_is_the_stores_prefix_grants_name() -> None:
    # The grants are on the prefix the store writes every key under, and only there.
    assert PAYLOAD_PREFIX == PREFIX == "o/"


def test_the_bucket_is_encrypted_by_s3_private_unversioned_and_aborts_stale_uploads(synth: Synth) -> None:
    _, bucket = _bucket(synth)
    props = bucket["Properties"]
    assert props["BucketEncryption"] == {
        "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
    }
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert props["OwnershipControls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    # Versioning off: a deleted payload is gone, not kept as an old version.
    assert "VersioningConfiguration" not in props
    assert props["LifecycleConfiguration"] == {
        "Rules": [
            {
                "Id": "abort-incomplete-uploads",
                "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
                "Status": "Enabled",
            }
        ]
    }
    # No rule expires objects: an object lives as long as its item's row (the store and the reaper
    # delete it), however long the queue's expire_timeout.
    assert all("ExpirationInDays" not in rule for rule in props["LifecycleConfiguration"]["Rules"])
    # CloudFormation names it: no name two stages or accounts could clash on.
    assert "BucketName" not in props


def test_the_bucket_policy_denies_every_request_not_over_tls(synth: Synth) -> None:
    logical_id, _ = _bucket(synth)
    (policy,) = synth.of_type("AWS::S3::BucketPolicy").values()
    assert policy["Properties"]["Bucket"] == {"Ref": logical_id}
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert statement["Effect"] == "Deny"
    assert statement["Action"] == "s3:*"
    assert statement["Principal"] == {"AWS": "*"}
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert statement["Resource"] == [_arn(synth), {"Fn::Join": ["", [_arn(synth), "/*"]]}]


def test_dev_stage_bucket_is_deleted_with_the_stack_like_its_tables(synth: Synth) -> None:
    _, bucket = _bucket(synth)
    assert bucket["DeletionPolicy"] == bucket["UpdateReplacePolicy"] == "Delete"
    for table in synth.of_type("AWS::DynamoDB::Table").values():
        assert table["DeletionPolicy"] == bucket["DeletionPolicy"]
    # No auto-delete custom resource: no function outside the permissions table, none of Node.js.
    assert not [r for r in synth.resources.values() if r["Type"].startswith("Custom::")]
    functions = synth.of_type("AWS::Lambda::Function").values()
    assert len(functions) == len(FUNCTION_NAMES)


def test_a_bucket_outside_dev_is_retained() -> None:
    # GIVEN the bucket alone in a prod-stage stack
    stack = Stack(App(), "PayloadsOnly")
    PayloadBucket(stack, "Payloads", config=StageConfig(stage="prod", alarm_email="ops@example.com"))
    # WHEN synthesized
    (bucket,) = Template.from_stack(stack).find_resources("AWS::S3::Bucket").values()
    # THEN it survives a stack deletion or replacement, with its objects
    assert bucket["DeletionPolicy"] == bucket["UpdateReplacePolicy"] == "Retain"


def test_the_bucket_logical_id_is_stable(synth: Synth) -> None:
    # A new logical id is a new, empty bucket: the rows would name objects of the old one.
    assert synth.logical_id(synth.stack.payloads.bucket) == "PayloadsBucket1715615A"
    assert synth.outputs["PayloadBucketName"]["Value"] == {"Ref": "PayloadsBucket1715615A"}


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_the_functions_that_handle_items_and_only_they_get_the_buckets_name(synth: Synth, name: str) -> None:
    fn = synth.stack.functions[name]
    variables = synth.resources[synth.logical_id(fn.function)]["Properties"]["Environment"]["Variables"]
    if name in S3_ACTIONS:
        assert variables[EnvVar.PAYLOAD_BUCKET] == {"Ref": _bucket(synth)[0]}
    else:
        assert EnvVar.PAYLOAD_BUCKET not in variables


def test_every_function_that_reads_or_writes_items_is_in_the_s3_table() -> None:
    # A function that reads item rows without the bucket would fail on a row naming an object.
    assert set(S3_ACTIONS) == set(FUNCTION_NAMES) - {"meta", "queues"}
    for actions in S3_ACTIONS.values():
        assert actions <= S3_OBJECT_ACTIONS | S3_BUCKET_ACTIONS


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_each_function_has_exactly_its_s3_actions_on_the_payload_objects_alone(
    synth: Synth, name: str
) -> None:
    granted: set[tuple[str, str, str]] = set()
    for statement in _s3_statements(synth, name):
        assert statement["Effect"] == "Allow"
        for action in _as_list(statement["Action"]):
            # spelled out: never s3:*, s3:*Object or s3:List*
            assert "*" not in action, statement
            for resource in _as_list(statement["Resource"]):
                condition = json.dumps(statement.get("Condition"), sort_keys=True)
                if resource == _objects(synth):
                    granted.add((action, "objects", condition))
                elif resource == _arn(synth):
                    granted.add((action, "bucket", condition))
                else:
                    raise AssertionError(f"{name}: {action} on {resource}")
    listing = json.dumps({"StringLike": {"s3:prefix": f"{PREFIX}*"}}, sort_keys=True)
    expected = {
        (action, "objects", "null") if action in S3_OBJECT_ACTIONS else (action, "bucket", listing)
        for action in S3_ACTIONS.get(name, frozenset())
    }
    assert granted == expected


def test_only_the_reaper_lists_and_only_the_objects_prefix() -> None:
    assert {name for name, actions in S3_ACTIONS.items() if actions & S3_BUCKET_ACTIONS} == {REAPER}
