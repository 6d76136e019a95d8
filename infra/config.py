"""Stage settings of the CDK app, read from CDK context.

Every knob that differs between a developer's stack and production is here, typed and validated
once; constructs read ``StageConfig`` and never the context. Tests build a ``StageConfig`` directly,
with temporary asset directories, so a synth needs neither the functions nor a built layer.

Context (``cdk.json`` or ``-c key=value``; values from ``-c`` arrive as strings):

``stage``                   stack ``querator-<stage>``; selects ``stages.<stage>`` in ``cdk.json``
``stages``                  per-stage objects with any of the keys below
``runtime``                 ``python3.12`` (default) or ``python3.13``; the layer must be built for it
``architecture``            ``arm64`` (default) or ``x86_64``
``reaperRateMinutes``       schedule of the reaper, default 1 (``rate(1 minute)``)
``reservedConcurrency``     ``{function: n}``, unset by default
``memoryMb``                ``{function: MB}``: replaces a function's memory from ``infra/timeouts.py``
                            (128 to 10,240; memory also buys CPU: 1,769 MB is one vCPU)
``provisionedConcurrency``  ``{function: n}``; a function with n > 0 is served through alias ``live``
``logRetentionDays``        one of CloudWatch's retention values, default 30
``retainData``              keep tables and logs when the stack is deleted; default: stage is not dev
``alarmEmail``              subscribe this address to a new alarm topic
``alarmTopicArn``           or send alarms to an existing SNS topic. A stage that retains data must
                            have one of the two: its synth fails otherwise. A value starting with
                            ``<`` is a placeholder (``cdk.json`` prod has one) and counts as unset.
``accountConcurrencyAlarm`` alarm when the account's concurrent executions reach this many (default
                            800: 80 % of Lambda's default 1,000 per region; set it from your quota)
``apiFlavour``              ``rest`` (default: a REST API, which LocalStack Community serves) or ``http``
                            (an HTTP API: $1.00 per million calls against $3.50, no WAF, resource
                            policy or private endpoint; docs/adr/0094-api-flavour.md). Stage ``prod``
                            sets ``http``. Switching a deployed stage replaces its API (a new
                            ``ApiUrl``; docs/deploy.md, "Which API")
``apiThrottleRate`` / ``apiThrottleBurst``   stage-wide API Gateway throttling (requests/s, burst)
``apiCloudWatchRole``       create API Gateway's account-wide logging role (default true; REST only: an
                            HTTP API writes its access logs without it)
``tracing``                 X-Ray active tracing (default true)
``leaseWaitCapSeconds``     longest a lease request waits (default 20; API Gateway gives up at 29)
``oldestItemAgeAlarmSeconds``  alarm when the oldest due item is older (default 3600)
``deadLetterDepthAlarm``    alarm when dead-letter queues hold more items (default 0)
``storeReadTimeoutSeconds`` how long a function waits for a DynamoDB reply before botocore sends the
                            request again (1 to 900; unset: the functions' 5 s). Stage ``local`` sets
                            30: an emulator on a laptop can answer later than 5 s, and a write sent
                            again after it was applied fails its own condition
``layerAssetPath``          the built layer (default ``layers/core/dist``)
``bundleLayer``             give every function one asset, the layer's contents and all the functions'
                            folders, and attach no layer (default false; stage ``local``: LocalStack
                            Community ignores layers)
``functionsAssetRoot``      folder of ``<function>/handler.py`` (default ``functions``)
``engine``                  the storage engine the functions run (``QUERATOR_ENGINE``): 3 (default),
                            engine v3's claim logs, which also serves what engine v2 stored; 2, engine
                            v2 alone, which does not see items in logs (a rollback: docs/deploy.md,
                            "Engines"; docs/adr/0100-engine-v3-candidates.md)
``streamTicketsRequired``   every stream subscribe must show a ``stream.ticket`` of its queue (default
                            true): ``$connect`` names no queue, so without tickets a consumer granted
                            one queue could subscribe to any. False for consumers older than tickets
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from infra.permissions import FUNCTION_NAMES
from infra.timeouts import LEASE_WAIT_CAP_MAX
from querator.config import DEFAULT_ENGINE, ENGINES, MAX_STORE_READ_TIMEOUT

if TYPE_CHECKING:
    from collections.abc import Mapping

    from constructs import Node

#: Runtimes the layer can be built for (``layers/core/build.py --python-version``).
RUNTIMES: Final = ("python3.12", "python3.13")
ARCHITECTURES: Final = ("arm64", "x86_64")
#: API Gateway's two kinds of HTTP front door (docs/adr/0094-api-flavour.md).
API_FLAVOURS: Final = ("rest", "http")
#: The values CloudWatch Logs accepts for a retention, in days.
RETENTION_DAYS: Final = frozenset(
    {1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653}
)
#: Stages that hold only throw-away data: their tables and logs are destroyed with the stack.
DEV_STAGES: Final = ("dev", "local", "test")

_EMPTY: Final[MappingProxyType[str, int]] = MappingProxyType({})
#: The longest read timeout the functions accept (Lambda's longest run).
STORE_READ_TIMEOUT_MAX_SECONDS: Final = int(MAX_STORE_READ_TIMEOUT.total_seconds())
#: An alarm destination starting with this is a placeholder to replace, not a destination.
PLACEHOLDER_PREFIX: Final = "<"


class StageConfigError(ValueError):
    """A context value is missing or wrong; the message names the key."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StageConfig:
    """Settings of one deployed stage."""

    stage: str = "dev"
    runtime: str = "python3.12"
    architecture: str = "arm64"
    reaper_rate_minutes: int = 1
    reserved_concurrency: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    memory_mb: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    provisioned_concurrency: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    log_retention_days: int = 30
    #: ``None``: derived from the stage (dev stages do not retain).
    retain_data: bool | None = None
    alarm_email: str | None = None
    alarm_topic_arn: str | None = None
    account_concurrency_alarm: int = 800
    api_flavour: str = "rest"
    api_throttle_rate: int = 100
    api_throttle_burst: int = 200
    api_cloud_watch_role: bool = True
    tracing: bool = True
    lease_wait_cap_seconds: int = 20
    oldest_item_age_alarm_seconds: int = 3600
    dead_letter_depth_alarm: int = 0
    #: ``None``: the functions' own default (``querator.config.DEFAULT_STORE_READ_TIMEOUT``).
    store_read_timeout_seconds: int | None = None
    layer_asset_path: str = "layers/core/dist"
    bundle_layer: bool = False
    functions_asset_root: str = "functions"
    stream_tickets_required: bool = True
    engine: int = DEFAULT_ENGINE

    def __post_init__(self) -> None:
        if not self.stage or not self.stage.replace("-", "").isalnum():
            raise StageConfigError(f"stage={self.stage!r}: letters, digits and '-' only")
        if self.runtime not in RUNTIMES:
            raise StageConfigError(f"runtime={self.runtime!r}: one of {', '.join(RUNTIMES)}")
        if self.architecture not in ARCHITECTURES:
            raise StageConfigError(f"architecture={self.architecture!r}: one of {', '.join(ARCHITECTURES)}")
        if self.api_flavour not in API_FLAVOURS:
            raise StageConfigError(f"apiFlavour={self.api_flavour!r}: one of {', '.join(API_FLAVOURS)}")
        if self.log_retention_days not in RETENTION_DAYS:
            raise StageConfigError(f"logRetentionDays={self.log_retention_days}: not a CloudWatch value")
        if not 1 <= self.reaper_rate_minutes <= 60:
            raise StageConfigError("reaperRateMinutes: 1 to 60")
        # API Gateway's integration timeout is 29 s; the lease function needs time after the wait.
        if not 0 < self.lease_wait_cap_seconds <= LEASE_WAIT_CAP_MAX:
            raise StageConfigError(f"leaseWaitCapSeconds: 1 to {LEASE_WAIT_CAP_MAX} (infra/timeouts.py)")
        for name in ("alarm_email", "alarm_topic_arn"):
            if str(getattr(self, name) or "").startswith(PLACEHOLDER_PREFIX):
                object.__setattr__(self, name, None)
        if self.retains_data and not (self.alarm_email or self.alarm_topic_arn):
            raise StageConfigError(
                f"stage {self.stage!r} retains data, so its alarms must notify someone: set "
                f"alarmTopicArn (an SNS topic ARN) or alarmEmail, in cdk.json stages.{self.stage} or with "
                "-c alarmTopicArn=arn:aws:sns:<region>:<account>:<topic> (docs/deploy.md, Alarms)"
            )
        if self.store_read_timeout_seconds is not None and not (
            1 <= self.store_read_timeout_seconds <= STORE_READ_TIMEOUT_MAX_SECONDS
        ):
            raise StageConfigError(f"storeReadTimeoutSeconds: 1 to {STORE_READ_TIMEOUT_MAX_SECONDS}")
        if self.engine not in ENGINES:
            raise StageConfigError(f"engine={self.engine}: one of {', '.join(map(str, ENGINES))}")
        if self.account_concurrency_alarm < 1:
            raise StageConfigError("accountConcurrencyAlarm: at least 1")
        for name, table in (
            ("reservedConcurrency", self.reserved_concurrency),
            ("provisionedConcurrency", self.provisioned_concurrency),
        ):
            unknown = set(table) - set(FUNCTION_NAMES)
            if unknown:
                raise StageConfigError(f"{name}: unknown function(s) {sorted(unknown)}")
            if any(value < 0 for value in table.values()):
                raise StageConfigError(f"{name}: counts are >= 0")
        unknown = set(self.memory_mb) - set(FUNCTION_NAMES)
        if unknown:
            raise StageConfigError(f"memoryMb: unknown function(s) {sorted(unknown)}")
        if any(not 128 <= value <= 10240 for value in self.memory_mb.values()):
            raise StageConfigError("memoryMb: 128 to 10240 MB (Lambda's range)")

    @property
    def stack_name(self) -> str:
        return f"querator-{self.stage}"

    @property
    def retains_data(self) -> bool:
        if self.retain_data is not None:
            return self.retain_data
        return self.stage not in DEV_STAGES

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> StageConfig:
        """Build from context-style keys (camelCase, values possibly strings from ``-c``)."""
        by_key = {_camel(f.name): f for f in fields(cls)}
        unknown = set(values) - set(by_key) - {"stages"}
        if unknown:
            raise StageConfigError(f"unknown context key(s): {sorted(unknown)}")
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            if key == "stages" or value is None:
                continue
            kwargs[by_key[key].name] = _coerce(key, value, _kind(by_key[key].type))
        return cls(**kwargs)

    @classmethod
    def from_context(cls, node: Node) -> StageConfig:
        """The stage's settings: defaults, then ``stages.<stage>``, then top-level context keys."""
        stage = node.try_get_context("stage") or "dev"
        stages = _as_mapping("stages", node.try_get_context("stages") or {})
        per_stage = _as_mapping(f"stages.{stage}", stages.get(stage) or {})
        values: dict[str, object] = {"stage": stage, **per_stage}
        for key in (_camel(f.name) for f in fields(cls)):
            if key != "stage" and (value := node.try_get_context(key)) is not None:
                values[key] = value
        return cls.from_mapping(values)


def _kind(annotation: object) -> str:
    """How to read a context value for a field, from its annotation (a string under PEP 563)."""
    text = str(annotation)
    if text.startswith("Mapping"):
        return "counts"
    for kind in ("bool", "int"):
        if text.startswith(kind):
            return kind
    return "str"


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _as_mapping(key: str, value: object) -> Mapping[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise StageConfigError(f"{key}: not JSON: {value!r}") from exc
    if not isinstance(value, dict):
        raise StageConfigError(f"{key}: expected an object, got {value!r}")
    return value


def _coerce(key: str, value: object, kind: str) -> object:
    if kind == "str":
        return str(value)
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if str(value).lower() in {"true", "1", "yes"}:
            return True
        if str(value).lower() in {"false", "0", "no"}:
            return False
        raise StageConfigError(f"{key}: expected true or false, got {value!r}")
    if kind == "int":
        return _whole(key, value)
    counts = _as_mapping(key, value)
    return MappingProxyType({name: _whole(f"{key}.{name}", n) for name, n in counts.items()})


def _whole(key: str, value: object) -> int:
    if isinstance(value, bool):
        raise StageConfigError(f"{key}: expected a whole number, got {value!r}")
    try:
        return int(str(value))
    except ValueError as exc:
        raise StageConfigError(f"{key}: expected a whole number, got {value!r}") from exc
