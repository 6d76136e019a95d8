"""The synthesized stack deployed onto moto's CloudFormation, and its functions run as Lambda would.

- ``RecordingMoto``: one moto server for the functions (every service, single-threaded so conditional
  writes are atomic) and one for the deploys, over the same backends, in threads of the test process,
  behind a WSGI recorder that notes every AWS call: who signed it
  (the access key), the service and the operation, and its body (for S3, a REST protocol, the
  operation named from the request and the body as its bucket, key, copy source, prefix or keys).
- ``deploy``: what ``cdk deploy`` needs in place (the bootstrap version parameter, the asset bucket
  with every asset zipped into it), then ``create_stack`` with the template as synthesized, except
  that resource types moto does not model are replaced by placeholders that keep their logical ids
  and dependencies (``PLACEHOLDER_TYPES`` lists them; anything else unsupported fails the deploy).
- ``Deployment``: each function's deployed code (the S3 object its ``Code`` points at) and its layer,
  run by a warm ``function_worker.py`` on the runtime's Python with the environment the stack gave the
  function and the credentials of its own role (``sts.assume_role``), so every call it makes is
  signed by that role's access key; requests go through the API's deployed resources, methods,
  integrations and Lambda permissions, the reaper through the schedule rule's target.
- API Gateway's IAM authorization, for a request signed as a role (``Deployment.request(...,
  signer=<role ARN>)``): the role's deployed policies must allow ``execute-api:Invoke`` on the
  method ARN of the request's own path (``iam_policy``), else 403 and no function runs.
"""

from __future__ import annotations

import fnmatch
import html
import io
import json
import re
import shutil
import subprocess
import threading
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, unquote

import boto3
from moto.cloudformation.parsing import get_model_map
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import WSGIRequestHandler, make_server

from querator.config import EnvVar
from tests.infra import iam_policy

ACCOUNT: Final = "123456789012"
REGION: Final = "us-east-1"
#: The CDK's default bootstrap qualifier: the template's version parameter and asset bucket use it.
QUALIFIER: Final = "hnb659fds"
BOOTSTRAP_VERSION: Final = "27"
#: Resource types moto's CloudFormation does not model, which may be stood in for. They are
#: observability and settings around the stack (alarms, the API stage's settings and the
#: account-wide logging role, async-invoke settings); nothing the functions call at run time.
PLACEHOLDER_TYPES: Final = frozenset(
    {
        "AWS::CloudWatch::Alarm",
        "AWS::ApiGateway::Stage",
        "AWS::ApiGateway::Account",
        "AWS::Lambda::EventInvokeConfig",
        # The stream's WebSocket API: moto's CloudFormation does not model API Gateway v2. The
        # stream function is invoked with recorded WebSocket events instead (its Lambda permission
        # from the API is still checked against the template).
        "AWS::ApiGatewayV2::Api",
        "AWS::ApiGatewayV2::Route",
        "AWS::ApiGatewayV2::Integration",
        "AWS::ApiGatewayV2::Stage",
        # The payload bucket's policy, which denies requests not over TLS: moto models no bucket
        # policy (and the functions reach moto over plain HTTP). Checked on the template instead
        # (test_cdk_payloads.py); the functions' S3 calls are checked against their roles.
        "AWS::S3::BucketPolicy",
    }
)
#: Types moto models but that must not act here: moto would run the dispatcher in Docker on every
#: stream record of the items table. The tests invoke the dispatcher with the records themselves.
STOOD_IN_ANYWAY: Final = frozenset({"AWS::Lambda::EventSourceMapping"})
WORKER: Final = Path(__file__).with_name("function_worker.py")
EVENTS: Final = Path(__file__).resolve().parents[1] / "events"


# -- the recording moto server -------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One AWS request as it reached the server."""

    access_key: str
    service: str
    operation: str
    body: dict[str, Any]


def s3_call(environ: dict[str, Any], raw: bytes) -> tuple[str, dict[str, Any]]:
    """An S3 request (path-style, as the functions address moto) as its operation and what IAM
    authorizes it on: ``Bucket``, ``Key``, ``CopySource``, ``Prefix`` (a listing), ``Keys`` (a
    ``DeleteObjects``). A request this does not know is ``"<METHOD> <path>?<query>"``, which the
    audit refuses to map (so it is never ignored). Object bodies are not kept."""
    method = environ["REQUEST_METHOD"]
    path = environ.get("PATH_INFO", "")
    query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    bucket, _, key = path.lstrip("/").partition("/")
    body: dict[str, Any] = {"Bucket": bucket}
    if key:
        body["Key"] = key
    subresources = set(query) - {"x-id"}
    if key and not subresources:
        copy_source = environ.get("HTTP_X_AMZ_COPY_SOURCE")
        if method == "PUT" and copy_source:
            return "CopyObject", {**body, "CopySource": unquote(copy_source)}
        named = {"PUT": "PutObject", "GET": "GetObject", "HEAD": "HeadObject", "DELETE": "DeleteObject"}
        if method in named:
            return named[method], body
    if not key and method == "GET" and query.get("list-type") == ["2"]:
        return "ListObjectsV2", {**body, "Prefix": query.get("prefix", [""])[0]}
    if not key and method == "POST" and "delete" in query:
        keys = [html.unescape(k) for k in re.findall(r"<Key>(.*?)</Key>", raw.decode(errors="replace"))]
        return "DeleteObjects", {**body, "Keys": keys}
    return f"{method} {path}?{environ.get('QUERY_STRING', '')}", body


#: Where ``_Recorder`` leaves a request's operation in its WSGI environ, for the timing of the answer.
_OPERATION: Final = "querator.test.operation"


class _Recorder:
    """WSGI middleware: note the call, then hand the request to moto unchanged, except for a
    ``TransactWriteItems`` whose ``ClientRequestToken`` already succeeded (see ``_replayed``)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        # ClientRequestToken -> the first successful reply (status, headers, body).
        self._transactions: dict[str, tuple[str, list[tuple[str, str]], bytes]] = {}
        self.replayed_transactions = 0
        #: Every answer's time in seconds, with its operation and the port of the server that gave
        #: it: the fixture prints the slowest the functions waited for.
        self.durations: list[tuple[float, str, int]] = []

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        started = time.monotonic()
        try:
            return self._handle(environ, start_response)
        finally:
            with self._lock:
                answered = time.monotonic() - started
                self.durations.append((answered, environ.get(_OPERATION, ""), int(environ["SERVER_PORT"])))

    def _handle(self, environ: dict[str, Any], start_response: Any) -> Any:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        raw = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(raw)
        credential = re.search(
            r"Credential=([^/]+)/[^/]+/[^/]+/([^/]+)/", environ.get("HTTP_AUTHORIZATION", "")
        )
        if credential:
            target = environ.get("HTTP_X_AMZ_TARGET", "")
            body: dict[str, Any] = {}
            if target:  # JSON protocols (DynamoDB, ...): the operation is in the header
                operation = target.rpartition(".")[2]
                body = json.loads(raw or b"{}")
            elif environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
                # Query protocols (STS, IAM, CloudWatch, ...). By the content type, not by "Action="
                # in the body: an uploaded asset's files may hold that text too.
                form = parse_qs(raw.decode())
                operation = form["Action"][0]
                body = {k: v[0] for k, v in form.items()}
            elif credential.group(2) == "s3":  # a REST protocol: named from the request
                operation, body = s3_call(environ, raw)
            else:  # REST protocols: no operation name on the wire
                operation = f"{environ['REQUEST_METHOD']} {environ.get('PATH_INFO', '')}"
            environ[_OPERATION] = operation
            with self._lock:
                self.calls.append(Call(credential.group(1), credential.group(2), operation, body))
            if operation == "TransactWriteItems" and body.get("ClientRequestToken"):
                return self._replayed(body["ClientRequestToken"], environ, start_response)
        return self.app(environ, start_response)

    def _replayed(self, token: str, environ: dict[str, Any], start_response: Any) -> Any:
        """DynamoDB makes a transaction idempotent by its ``ClientRequestToken`` (which botocore fills
        in and keeps across its own retries); moto ignores it. Without this, a transaction that moto
        applied but answered after the caller's read timeout (this server answers one request at a
        time) is retried, fails its conditions, and reads as "someone else acted" where DynamoDB
        would have answered success: a test artifact, not the product's behaviour."""
        with self._lock:
            seen = self._transactions.get(token)
            if seen is not None:
                self.replayed_transactions += 1
        if seen is not None:
            status, headers, body = seen
            start_response(status, headers)
            return [body]
        reply: dict[str, Any] = {}

        def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            reply["status"], reply["headers"] = status, headers
            return start_response(status, headers, exc_info)

        chunks = list(self.app(environ, keep))
        if reply.get("status", "").startswith("200"):
            with self._lock:
                self._transactions[token] = (reply["status"], reply["headers"], b"".join(chunks))
        return chunks


class RecordingMoto:
    """A moto server on 127.0.0.1 in a background thread, recording every signed request."""

    def __init__(self) -> None:
        class Quiet(WSGIRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass

        self.recorder = _Recorder(DomainDispatcherApplication(create_backend_app))
        self._local = threading.local()
        # Two servers over the same backends, each answering one request at a time. The functions
        # use the first, so their conditional writes are atomic as DynamoDB's are. The deploys use the
        # second: a CreateStack is one request that builds the whole stack (1-3 s), and on the first
        # it would stop every other stage's lifecycle (and its 1-2 s leases) while it runs.
        self._servers = [
            make_server("127.0.0.1", 0, self.recorder, threaded=False, request_handler=Quiet)
            for _ in range(2)
        ]
        self.endpoint, self.deploy_endpoint = (f"http://127.0.0.1:{s.port}" for s in self._servers)
        # Polled every 0.1 s for shutdown (not the default 0.5 s): the module's end waits on it.
        self._threads = [
            threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.1}, name="moto", daemon=True)
            for s in self._servers
        ]
        for thread in self._threads:
            thread.start()

    def client(self, service: str, *, deploying: bool = False, **credentials: str) -> Any:
        """A client of this server (``deploying``: of the deploys' server), made once per thread,
        service and credentials (making one costs milliseconds of this process's CPU, which the moto
        threads share)."""
        # A session per thread: boto3's default session is not safe to share between threads.
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = boto3.session.Session()
            self._local.clients = {}
        secrets = (credentials.get(k) for k in ("AccessKeyId", "SecretAccessKey", "SessionToken"))
        key = (service, deploying, *secrets)
        client = self._local.clients.get(key)
        if client is None:
            client = self._local.clients[key] = session.client(
                service,
                region_name=REGION,
                endpoint_url=self.deploy_endpoint if deploying else self.endpoint,
                aws_access_key_id=credentials.get("AccessKeyId", "testing"),
                aws_secret_access_key=credentials.get("SecretAccessKey", "testing"),
                aws_session_token=credentials.get("SessionToken"),
            )
        return client

    def calls_by(self, access_key: str) -> list[Call]:
        return [c for c in self.recorder.calls if c.access_key == access_key]

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)


# -- deploying the cloud assembly ----------------------------------------------------------------


def with_placeholders(
    template: dict[str, Any], supported: set[str], stack_name: str
) -> tuple[dict[str, Any], set[str]]:
    """The template with each resource of ``PLACEHOLDER_TYPES`` replaced by a log group (moto models
    it, and it answers both ``Ref`` and ``Fn::GetAtt Arn``) keeping its logical id and ``DependsOn``.
    A stage's ``Ref`` still resolves to the stage name. Returns the template and the types replaced."""
    copy = json.loads(json.dumps(template))
    replaced = set()
    for logical_id, resource in copy["Resources"].items():
        kind = resource["Type"]
        if kind in supported and kind not in STOOD_IN_ANYWAY:
            continue
        if kind not in PLACEHOLDER_TYPES | STOOD_IN_ANYWAY:
            raise AssertionError(f"{logical_id}: moto cannot deploy {kind} and it has no placeholder")
        # The REST stage's Ref must still be its name (the harness routes by it); nothing reads the
        # WebSocket stage's, and two log groups may not share a name.
        name = resource.get("Properties", {}).get("StageName") if kind == "AWS::ApiGateway::Stage" else None
        stand_in: dict[str, Any] = {
            "Type": "AWS::Logs::LogGroup",
            "Properties": {
                "LogGroupName": name if isinstance(name, str) else f"/placeholder/{stack_name}/{logical_id}"
            },
        }
        if "DependsOn" in resource:
            stand_in["DependsOn"] = resource["DependsOn"]
        copy["Resources"][logical_id] = stand_in
        replaced.add(kind)
    return copy, replaced


def _zip_folder(folder: Path) -> bytes:
    buffer = io.BytesIO()
    # Stored, not deflated: the bundled assets of stage local are ~20 MB each, which moto only keeps
    # and the harness unzips again (deflating and inflating them was seconds of the module's minute).
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(folder))
    return buffer.getvalue()


def _sub(text: str) -> str:
    return text.replace("${AWS::AccountId}", ACCOUNT).replace("${AWS::Region}", REGION)


def bootstrap(moto: RecordingMoto) -> None:
    """What ``cdk bootstrap`` leaves in an account, as far as a deploy reads it."""
    moto.client("ssm", deploying=True).put_parameter(
        Name=f"/cdk-bootstrap/{QUALIFIER}/version", Value=BOOTSTRAP_VERSION, Type="String", Overwrite=True
    )
    s3 = moto.client("s3", deploying=True)
    bucket = f"cdk-{QUALIFIER}-assets-{ACCOUNT}-{REGION}"
    if bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=bucket)


def publish_assets(moto: RecordingMoto, outdir: Path, stack_name: str) -> int:
    """Zip every asset of the assembly into the bootstrap bucket, as ``cdk deploy`` does."""
    manifest = json.loads((outdir / f"{stack_name}.assets.json").read_text(encoding="utf-8"))
    s3 = moto.client("s3", deploying=True)
    for asset in manifest["files"].values():
        source = outdir / asset["source"]["path"]
        body = _zip_folder(source) if asset["source"].get("packaging") == "zip" else source.read_bytes()
        for destination in asset["destinations"].values():
            s3.put_object(Bucket=_sub(destination["bucketName"]), Key=destination["objectKey"], Body=body)
    return len(manifest["files"])


# -- the deployed stack ----------------------------------------------------------------------------


@dataclass
class DeployedFunction:
    """One function as CloudFormation created it."""

    name: str
    logical_id: str
    function_name: str
    arn: str
    role_arn: str
    configuration: dict[str, Any]
    #: Template properties moto does not keep (layers, tracing, logging config).
    properties: dict[str, Any]
    access_key: str = ""
    #: Where its deployed code was unzipped (``/var/task``).
    task_root: Path | None = None
    log: Path | None = None
    worker: subprocess.Popen[str] | None = None
    #: How long the handler's import took in the worker; ``None`` until the worker said it was ready.
    import_seconds: float | None = None
    #: Invocations so far, of any source.
    invocations: int = 0

    @property
    def environment(self) -> dict[str, str]:
        variables: dict[str, str] = self.configuration.get("Environment", {}).get("Variables", {})
        return variables

    @property
    def tracing(self) -> bool:
        return bool(self.properties.get("TracingConfig", {}).get("Mode") == "Active")


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]
    function: str
    stdout: str


@dataclass
class Deployment:
    stage: str
    stack_name: str
    template: dict[str, Any]
    physical: dict[str, str]
    outputs: dict[str, str]
    functions: dict[str, DeployedFunction]
    replaced: set[str]
    moto: RecordingMoto
    api_id: str = ""
    api_stage: str = ""
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: (function, METHOD path) of every request the API routed, for the coverage check.
    routed: list[tuple[str, str]] = field(default_factory=list)
    #: (signer, METHOD path) of every request the IAM authorization refused.
    refused: list[tuple[str, str]] = field(default_factory=list)
    #: Each function's resource policy by function name, as ``_policy`` read it.
    _policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Each signing role's identity policy statements by role ARN, as ``authorize`` read them.
    _signers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    # -- wiring read back from the deployed resources ------------------------------------------

    def by_arn(self, arn: str) -> DeployedFunction:
        for fn in self.functions.values():
            if arn in {fn.arn, f"{fn.arn}:live"}:
                return fn
        raise AssertionError(f"{arn} is no function of the stack")

    def _policy(self, fn: DeployedFunction) -> dict[str, Any]:
        """The function's deployed resource policy, read from Lambda once: nothing changes it after
        ``create_stack``, and one read per request was ~3.5 s of each stage's ~25 s lifecycle."""
        policy = self._policies.get(fn.function_name)
        if policy is None:
            document = self.moto.client("lambda").get_policy(FunctionName=fn.function_name)["Policy"]
            policy = self._policies[fn.function_name] = json.loads(document)
        return policy

    def _permits(self, fn: DeployedFunction, principal: str, source_arn: str) -> bool:
        for statement in self._policy(fn)["Statement"]:
            if statement.get("Principal", {}).get("Service") != principal:
                continue
            condition = statement.get("Condition", {})
            pattern = condition.get("ArnLike", condition.get("ArnEquals", {})).get("AWS:SourceArn")
            if pattern is None or fnmatch.fnmatchcase(source_arn, pattern):
                return True
        return False

    def _route(self, method: str, path: str) -> tuple[str, dict[str, str] | None, dict[str, Any]]:
        """The API's resource, path parameters and method for a request, as API Gateway picks them:
        a literal resource first, then one whose ``{param}`` segments match a segment each (the
        scoped routes' ``{queue}``), then the deepest greedy ``{proxy+}`` whose parent is a prefix."""
        resource, parameters = self.resources.get(path), None
        if resource is None:
            resource, parameters = self._templated(path)
        if resource is None:
            proxies = [p for p in self.resources if p.endswith("/{proxy+}")]
            parents = [p for p in proxies if path.startswith(p.removesuffix("{proxy+}").rstrip("/") + "/")]
            assert parents, f"the API has no resource for {path}"
            longest = max(parents, key=len)
            resource = self.resources[longest]
            parameters = {"proxy": path.removeprefix(longest.removesuffix("{proxy+}"))}
        methods = resource.get("resourceMethods", {})
        chosen = methods.get(method) or methods.get("ANY")
        assert chosen is not None, f"{method} {path}: no method on {resource['path']}"
        return resource["path"], parameters, chosen

    def _templated(self, path: str) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
        """The resource whose ``{param}`` segments match ``path`` segment for segment (the fewest
        parameters wins: API Gateway prefers literal segments), with the parameters' values."""
        segments = path.split("/")
        found: list[tuple[int, str, dict[str, str]]] = []
        for template in self.resources:
            parts = template.split("/")
            if len(parts) != len(segments) or template.endswith("+}"):
                continue
            values = {}
            for part, segment in zip(parts, segments, strict=True):
                if part.startswith("{") and part.endswith("}") and segment:
                    values[part[1:-1]] = segment
                elif part != segment:
                    break
            else:
                found.append((len(values), template, values))
        if not found:
            return None, None
        _, template, values = min(found)
        return self.resources[template], values

    def execute_api_arn(self, method: str, path: str) -> str:
        """The ARN API Gateway's IAM authorizer checks ``execute-api:Invoke`` on for a request."""
        return f"arn:aws:execute-api:{REGION}:{ACCOUNT}:{self.api_id}/{self.api_stage}/{method}{path}"

    def authorize(self, role_arn: str, method: str, path: str) -> bool:
        """API Gateway's IAM authorization of a request signed as ``role_arn``: the role's identity
        policies (inline and attached managed, as deployed) allow ``execute-api:Invoke`` on the
        method ARN of the request's own path (``iam_policy``: Allow / Deny, ``*`` and ``?``)."""
        statements = self._signers.get(role_arn)
        if statements is None:  # read once: nothing changes a role's policies after create_stack
            role = role_arn.rsplit("/", 1)[1]
            statements = self._signers[role_arn] = iam_policy.role_statements(self.moto.client("iam"), role)
        request = iam_policy.Request("execute-api:Invoke", self.execute_api_arn(method, path))
        return iam_policy.allowed(statements, request)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        *,
        signer: str | None = None,
    ) -> Reply:
        """One signed client request, through the deployed resource, method, IAM authorization,
        integration and permission.

        ``signer``: the ARN of the role that signs it; the method's IAM authorization then evaluates
        that role's deployed policies before any function runs, and a refusal is API Gateway's 403
        with no function invoked (``refused`` records it). ``None``: the harness's own principal, an
        account administrator (``*`` on ``*``), whom every IAM authorization allows.
        """
        resource_path, parameters, chosen = self._route(method, path)
        assert chosen["authorizationType"] == "AWS_IAM", f"{method} {path} is not IAM-authenticated"
        if signer is not None and not self.authorize(signer, method, path):
            self.refused.append((signer, f"{method} {path}"))
            message = (
                f"User: {signer} is not authorized to perform: execute-api:Invoke on resource: "
                f"{self.execute_api_arn(method, path)}"
            )
            return Reply(403, {"Message": message}, {"x-amzn-ErrorType": "AccessDeniedException"}, "", "")
        integration = chosen["methodIntegration"]
        assert integration["type"] == "AWS_PROXY"
        arn = re.search(r"functions/(.+)/invocations$", integration["uri"])
        assert arn, integration["uri"]
        fn = self.by_arn(arn.group(1))
        source = f"arn:aws:execute-api:{REGION}:{ACCOUNT}:{self.api_id}/{self.api_stage}/{method}{path}"
        assert self._permits(fn, "apigateway.amazonaws.com", source), (
            f"{fn.name} may not be invoked by {source}"
        )
        self.routed.append((fn.name, f"{method} {resource_path}"))
        event = json.loads((EVENTS / "apigw_rest_proxy.json").read_text(encoding="utf-8"))
        event.update(resource=resource_path, path=path, httpMethod=method, pathParameters=parameters)
        event["body"] = None if body is None else json.dumps(body)
        event["headers"] = {**event["headers"], **(headers or {})}
        event["multiValueHeaders"] = {k: [v] for k, v in event["headers"].items()}
        context = event["requestContext"]
        context.update(
            resourcePath=resource_path, httpMethod=method, stage=self.api_stage, apiId=self.api_id,
            path=f"/{self.api_stage}{path}", requestId=str(uuid.uuid4()),
        )  # fmt: skip
        answer = invoke(fn, event)
        result = answer["result"]
        text = result.get("body") or ""
        try:
            parsed: Any = json.loads(text) if text else None
        except json.JSONDecodeError:
            parsed = text
        headers = {k: v[-1] for k, v in (result.get("multiValueHeaders") or {}).items()}
        headers.update(result.get("headers") or {})
        return Reply(result["statusCode"], parsed, headers, fn.name, answer["stdout"])

    def rule_of(self, function: str) -> dict[str, Any]:
        """The schedule rule whose target is ``function`` (the reaper's, the dispatcher's sweep)."""
        events = self.moto.client("events")
        arns = {self.functions[function].arn, f"{self.functions[function].arn}:live"}
        found = [
            rule
            for rule in events.list_rules()["Rules"]
            for target in events.list_targets_by_rule(Rule=rule["Name"])["Targets"]
            if target["Arn"] in arns
        ]
        (rule,) = found
        return rule

    def run_schedule(self, function: str = "reaper") -> dict[str, Any]:
        """Fire the schedule rule of ``function`` once: invoke its target as EventBridge would."""
        events = self.moto.client("events")
        rule = self.rule_of(function)
        assert rule["State"] == "ENABLED"
        (target,) = events.list_targets_by_rule(Rule=rule["Name"])["Targets"]
        fn = self.by_arn(target["Arn"])
        assert self._permits(fn, "events.amazonaws.com", rule["Arn"]), f"the rule may not invoke {fn.name}"
        event = json.loads((EVENTS / "eventbridge_scheduled.json").read_text(encoding="utf-8"))
        event["resources"] = [rule["Arn"]]
        answer = invoke(fn, event)
        self.routed.append((fn.name, "schedule"))
        return answer

    def invoke(self, function: str, event: dict[str, Any]) -> dict[str, Any]:
        """Invoke a function with an event of a source the harness cannot route (the WebSocket API,
        DynamoDB Streams): the deployed function, its environment and role, as the source would."""
        answer = invoke(self.functions[function], event)
        self.routed.append((function, str(event.get("requestContext", {}).get("routeKey") or "records")))
        return answer

    def physical_of(self, resource_type: str) -> str:
        (logical_id,) = [k for k, v in self.template["Resources"].items() if v["Type"] == resource_type]
        return self.physical[logical_id]

    def calls_of(self, name: str) -> list[Call]:
        return self.moto.calls_by(self.functions[name].access_key)

    def close_inputs(self) -> None:
        """Tell every worker to exit (end of its input), without waiting: workers exit side by side."""
        for fn in self.functions.values():
            if fn.worker is not None and fn.worker.stdin is not None and not fn.worker.stdin.closed:
                fn.worker.stdin.close()

    def stop(self) -> None:
        self.close_inputs()
        for fn in self.functions.values():
            if fn.worker is not None:
                try:
                    fn.worker.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    fn.worker.kill()  # our own child, by its handle: stuck mid-invocation
                    fn.worker.wait()
                fn.worker.stdout.close()  # type: ignore[union-attr]
                fn.worker = None


def _function_name_of(properties: dict[str, Any]) -> str:
    """``querator <name>``: the description every ``ServiceFunction`` gets."""
    description = str(properties.get("Description", ""))
    assert description.startswith("querator "), description
    return description.removeprefix("querator ")


def deploy(moto: RecordingMoto, outdir: Path, stack_name: str, stage: str) -> Deployment:
    """Bootstrap, publish the assets and create the stack; fail unless it is ``CREATE_COMPLETE``."""
    template = json.loads((outdir / f"{stack_name}.template.json").read_text(encoding="utf-8"))
    deployable, replaced = with_placeholders(template, set(get_model_map()), stack_name)
    bootstrap(moto)
    publish_assets(moto, outdir, stack_name)
    cfn = moto.client("cloudformation", deploying=True)
    cfn.create_stack(
        StackName=stack_name,
        TemplateBody=json.dumps(deployable),
        Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM"],
    )
    (stack,) = cfn.describe_stacks(StackName=stack_name)["Stacks"]
    assert stack["StackStatus"] == "CREATE_COMPLETE", stack.get("StackStatusReason")
    physical = {
        r["LogicalResourceId"]: r["PhysicalResourceId"]
        for r in cfn.describe_stack_resources(StackName=stack_name)["StackResources"]
        # moto leaves it out for a few types the tests never look up (AWS::IAM::Policy)
        if "PhysicalResourceId" in r
    }
    lambda_ = moto.client("lambda", deploying=True)
    functions = {}
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] != "AWS::Lambda::Function":
            continue
        configuration = lambda_.get_function_configuration(FunctionName=physical[logical_id])
        name = _function_name_of(resource["Properties"])
        functions[name] = DeployedFunction(
            name=name,
            logical_id=logical_id,
            function_name=configuration["FunctionName"],
            arn=configuration["FunctionArn"],
            role_arn=configuration["Role"],
            configuration=configuration,
            properties=resource["Properties"],
        )
    deployment = Deployment(
        stage=stage,
        stack_name=stack_name,
        template=template,
        physical=physical,
        outputs={o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])},
        functions=functions,
        replaced=replaced,
        moto=moto,
    )
    apigw = moto.client("apigateway", deploying=True)
    deployment.api_id = deployment.physical_of("AWS::ApiGateway::RestApi")
    (api_stage,) = [
        r["Properties"]["StageName"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::ApiGateway::Stage"
    ]
    deployment.api_stage = api_stage
    items = apigw.get_resources(restApiId=deployment.api_id, embed=["methods"], limit=500)["items"]
    deployment.resources = {r["path"]: r for r in items}
    return deployment


# -- running the functions -------------------------------------------------------------------------


def _layer_folder(deployment: Deployment, fn: DeployedFunction, layers: Path) -> Path:
    """The function's one layer, unzipped from the object its deployed ``LayerVersion`` was made of;
    for a function that carries the layer's contents itself (``bundleLayer``), its own folder."""
    if not fn.properties.get("Layers"):
        assert fn.task_root is not None
        return fn.task_root
    (layer_ref,) = fn.properties["Layers"]
    layer = deployment.template["Resources"][layer_ref["Ref"]]["Properties"]["Content"]
    # One folder per layer object: stages deploying the same layer share it, as functions do in Lambda.
    folder = layers / layer["S3Key"].removesuffix(".zip")
    _unzip_once(deployment.moto, _sub(layer["S3Bucket"]["Fn::Sub"]), layer["S3Key"], folder)
    return folder / "python"


def _unzip_once(moto: RecordingMoto, bucket: str, key: str, folder: Path) -> None:
    """The object unzipped into ``folder``, unless it is there already. The stages deploy on threads
    of their own and share a layer's folder: each unzips beside it and renames, so a stage never
    starts its workers over a folder another stage is still filling."""
    if folder.exists():
        return
    body = moto.client("s3", deploying=True).get_object(Bucket=bucket, Key=key)["Body"].read()
    partial = folder.with_name(f"{folder.name}.{uuid.uuid4().hex}.partial")
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        archive.extractall(partial)
    try:
        partial.rename(folder)
    except OSError:  # another stage renamed its copy first: the same object, so keep that one
        shutil.rmtree(partial)


def start_functions(deployment: Deployment, python: str, sdk: Path, root: Path, layers: Path) -> None:
    """One warm worker per function: its deployed code, the layer, its environment and role. The
    workers start their cold start and this returns: each function's first invocation (or
    ``wait_ready``) waits for its own."""
    sts = deployment.moto.client("sts", deploying=True)
    for fn in deployment.functions.values():
        code = fn.properties["Code"]
        # One folder per code object: the functions of a bundled stage share one asset, and each
        # environment only reads it (/var/task is read-only in Lambda).
        task_root = fn.task_root = root / code["S3Key"].removesuffix(".zip")
        _unzip_once(deployment.moto, _sub(code["S3Bucket"]["Fn::Sub"]), code["S3Key"], task_root)
        layer = _layer_folder(deployment, fn, layers)
        credentials = sts.assume_role(RoleArn=fn.role_arn, RoleSessionName=fn.function_name[:64])[
            "Credentials"
        ]
        fn.access_key = credentials["AccessKeyId"]
        log_group = fn.properties.get("LoggingConfig", {}).get("LogGroup", {}).get("Ref")
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "en_US.UTF-8",
            "TZ": ":UTC",
            # What Lambda's runtime sets for every function.
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EXECUTION_ENV": f"AWS_Lambda_{fn.configuration['Runtime']}",
            "AWS_LAMBDA_FUNCTION_NAME": fn.function_name,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(fn.configuration["MemorySize"]),
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_LOG_GROUP_NAME": deployment.physical.get(log_group, "") if log_group else "",
            "LAMBDA_TASK_ROOT": str(task_root),
            "_HANDLER": fn.configuration["Handler"],
            # A closed port: the X-Ray SDK sends segments over UDP and never waits for an answer.
            "AWS_XRAY_DAEMON_ADDRESS": "127.0.0.1:9",
            # The function's role, as the runtime hands it over.
            "AWS_ACCESS_KEY_ID": credentials["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": credentials["SecretAccessKey"],
            "AWS_SESSION_TOKEN": credentials["SessionToken"],
            # Every AWS endpoint is moto: the main way this environment differs from Lambda's.
            "AWS_ENDPOINT_URL": deployment.moto.endpoint,
            # The other: one single-threaded moto answers every stage's functions, and on a loaded
            # machine a reply can come later than the default 5 s. botocore then sends an applied
            # conditional write again, which fails its condition on its own write (CI, 2026-11-26:
            # most likely a complete, which then deleted nothing it could report). DynamoDB answers
            # in milliseconds; the functions wait for moto as long as they may run. What a retried
            # write does is the fault matrix's to test (tests/reliability, Fault.RETRIED).
            EnvVar.STORE_READ_TIMEOUT: str(fn.configuration["Timeout"]),
            "QUERATOR_TEST_FUNCTION_ARN": fn.arn,
            "QUERATOR_TEST_TIMEOUT_SECONDS": str(fn.configuration["Timeout"]),
            **fn.environment,
        }
        if "QUERATOR_STREAM_ENDPOINT" in env:
            # The stage's callback URL is API Gateway's host; the management API is moto's here.
            env["QUERATOR_STREAM_ENDPOINT"] = deployment.moto.endpoint
        # The function's log (stderr), as CloudWatch would keep it: read back when an invocation fails.
        fn.log = root / f"{fn.name}.log"
        with fn.log.open("w") as log:
            fn.worker = subprocess.Popen(  # noqa: S603 - the runtime's Python running the worker next to this file
                [python, "-S", str(WORKER), str(task_root), str(layer), str(sdk)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
            )  # fmt: skip


def wait_ready(deployment: Deployment) -> None:
    """Wait until every worker ``start_functions`` started has imported its handler."""
    for fn in deployment.functions.values():
        _wait_ready(fn)


def _wait_ready(fn: DeployedFunction) -> None:
    """The worker's cold start (its import of the handler), waited for once: by its first invocation,
    as Lambda's first request waits for the init, so a stage's first requests need not wait for the
    other functions' cold starts."""
    if fn.import_seconds is None:
        fn.import_seconds = float(_read(fn)["import_seconds"])


def _read(fn: DeployedFunction) -> dict[str, Any]:
    assert fn.worker is not None and fn.worker.stdout is not None
    line = fn.worker.stdout.readline()
    if not line:
        raise AssertionError(f"{fn.name} exited: {fn.worker.wait()}\n{_log_tail(fn)}")
    answer: dict[str, Any] = json.loads(line)
    return answer


def _log_tail(fn: DeployedFunction) -> str:
    return fn.log.read_text(encoding="utf-8")[-3000:] if fn.log and fn.log.exists() else ""


def invoke(fn: DeployedFunction, event: dict[str, Any]) -> dict[str, Any]:
    assert fn.worker is not None and fn.worker.stdin is not None
    _wait_ready(fn)
    fn.invocations += 1
    fn.worker.stdin.write(json.dumps({"event": event}) + "\n")
    fn.worker.stdin.flush()
    answer = _read(fn)
    assert "error" not in answer, f"{fn.name} failed:\n{answer['error']}\n{_log_tail(fn)}"
    return answer
