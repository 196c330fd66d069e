"""template.yaml as CloudFormation sees it: decoded, SAM-transformed, its intrinsics resolved.

The decode is cfn-lint's (it reads !Ref, !GetAtt and !Sub as CloudFormation does) and the
transform is aws-sam-translator's, the library the SAM transform runs: policies, event source
mappings and HttpApi routes come out in their CloudFormation form, and the harness reads
only that form, never a second copy of what the template says. Both libraries are slow to
import (about 6 s together), so the transformed template is cached under the run root by the
hash of template.yaml and their versions.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .awsjson import ACCOUNT, REGION
from .model import JsonObject, QueueMapping, StreamMapping

# SAM requires an S3 CodeUri to transform; the code itself is the host build's binary.
_DUMMY_CODE = "s3://aws-local/code.zip"
_PARTITION = "aws"

# A role's inline policy for what Lambda does as the role, not the function's code.
LAMBDA_SERVICE_POLICY = "lambda-service"


class Unresolved(Exception):
    """An intrinsic the harness cannot resolve (a resource it does not create)."""


@dataclass
class Physical:
    """What the harness created: each resource's Ref value and attributes (GetAtt)."""

    stack_name: str
    refs: dict[str, str] = field(default_factory=dict)
    attrs: dict[tuple[str, str], str] = field(default_factory=dict)


@dataclass(frozen=True)
class Function:
    """One AWS::Lambda::Function as the harness runs it."""

    logical_id: str
    name: str
    arn: str
    binary: str  # Metadata.BuildProperties.Binary in the original template
    timeout_s: int
    memory_mb: int
    environment: dict[str, str]
    statements: list[JsonObject]  # every Allow/Deny statement of its role's inline policies
    reserved_concurrency: int | None = None  # ReservedConcurrentExecutions, if set


@dataclass(frozen=True)
class Route:
    """One HttpApi route: `method` is upper-case or ANY; `path` is `/l/{id}` or `$default`."""

    method: str
    path: str
    function: str
    authorization: str = "NONE"  # or AWS_IAM: the operation's `security` names a sigv4 scheme

    @property
    def key(self) -> str:
        """The route key as API Gateway names it (safe to log: no pool id)."""
        return "$default" if self.path == "$default" else f"{self.method} {self.path}"


class Template:
    """The transformed template, and the original (for what the transform drops)."""

    def __init__(self, original: JsonObject, transformed: JsonObject):
        self.original = original
        self.transformed = transformed
        self.resources: dict[str, JsonObject] = transformed["Resources"]
        self.parameters: dict[str, str] = {
            name: _string(spec["Default"])
            for name, spec in transformed.get("Parameters", {}).items()
            if "Default" in spec
        }

    def of_type(self, kind: str) -> list[str]:
        return [rid for rid, res in self.resources.items() if res.get("Type") == kind]

    def properties(self, logical_id: str) -> JsonObject:
        props: JsonObject = self.resources[logical_id].get("Properties", {})
        return props

    # ---- intrinsics ------------------------------------------------------------------------
    def override(self, values: dict[str, str]) -> None:
        """Parameter values given at deploy (sam deploy --parameter-overrides)."""
        unknown = set(values) - set(self.transformed.get("Parameters", {}))
        if unknown:
            raise Unresolved(f"no such parameter: {sorted(unknown)}")
        self.parameters.update(values)

    def condition(self, name: str, physical: Physical) -> bool:
        """A condition of the template's Conditions, with its parameters as they are."""
        return self._truth(self.transformed.get("Conditions", {})[name], physical)

    def _truth(self, value: Any, physical: Physical) -> bool:
        ((key, arg),) = value.items()
        if key == "Fn::Equals":
            left, right = (_string(self.resolve(v, physical)) for v in arg)
            return left == right
        if key == "Fn::Not":
            return not self._truth(arg[0], physical)
        if key == "Fn::And":
            return all(self._truth(v, physical) for v in arg)
        if key == "Fn::Or":
            return any(self._truth(v, physical) for v in arg)
        if key == "Condition":
            return self.condition(arg, physical)
        raise Unresolved(f"{key} in a condition is not supported")

    def resolve(self, value: Any, physical: Physical) -> Any:
        """Resolves Ref, Fn::GetAtt, Fn::Sub, Fn::Join and Fn::If in `value`, recursively
        (`None` for AWS::NoValue)."""
        if isinstance(value, list):
            return [self.resolve(v, physical) for v in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, arg),) = value.items()
            if key == "Ref":
                return self._ref(arg, physical)
            if key == "Fn::GetAtt":
                rid, attr = arg.split(".", 1) if isinstance(arg, str) else arg
                return self._getatt(rid, attr, physical)
            if key == "Fn::Sub":
                return self._sub(arg, physical)
            if key == "Fn::Join":
                delimiter, parts = arg
                return delimiter.join(_string(self.resolve(p, physical)) for p in parts)
            if key == "Fn::If":
                name, then, otherwise = arg
                return self.resolve(then if self.condition(name, physical) else otherwise, physical)
            if key.startswith("Fn::"):
                raise Unresolved(f"{key} is not supported")
        return {k: self.resolve(v, physical) for k, v in value.items()}

    def _ref(self, name: str, physical: Physical) -> str:
        pseudo = {
            "AWS::Region": REGION,
            "AWS::AccountId": ACCOUNT,
            "AWS::StackName": physical.stack_name,
            "AWS::Partition": _PARTITION,
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{physical.stack_name}/0",
        }
        if name == "AWS::NoValue":
            return None  # type: ignore[return-value]
        if name in pseudo:
            return pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        if name in physical.refs:
            return physical.refs[name]
        raise Unresolved(f"Ref {name}")

    def _getatt(self, rid: str, attr: str, physical: Physical) -> str:
        try:
            return physical.attrs[(rid, attr)]
        except KeyError:
            raise Unresolved(f"GetAtt {rid}.{attr}") from None

    def _sub(self, arg: Any, physical: Physical) -> str:
        text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])

        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in variables:
                return _string(self.resolve(variables[name], physical))
            if "." in name and not name.startswith("AWS::"):
                rid, attr = name.split(".", 1)
                return self._getatt(rid, attr, physical)
            return self._ref(name, physical)

        return re.sub(r"\$\{([^}]+)\}", one, text)

    # ---- what the harness reads ------------------------------------------------------------
    def functions(self, physical: Physical) -> list[Function]:
        found = []
        for rid in self.of_type("AWS::Lambda::Function"):
            props = self.properties(rid)
            variables = props.get("Environment", {}).get("Variables", {})
            environment = {k: _string(v) for k, v in self.resolve(variables, physical).items()}
            found.append(
                Function(
                    logical_id=rid,
                    name=physical.refs[rid],
                    arn=physical.attrs[(rid, "Arn")],
                    binary=self.original["Resources"][rid]["Metadata"]["BuildProperties"]["Binary"],
                    timeout_s=int(self.resolve(props.get("Timeout", 3), physical)),
                    memory_mb=int(self.resolve(props.get("MemorySize", 128), physical)),
                    environment=environment,
                    statements=self._statements(props.get("Role"), physical),
                    reserved_concurrency=_reserved(
                        self.resolve(props.get("ReservedConcurrentExecutions"), physical)
                    ),
                )
            )
        return found

    def _statements(self, role: Any, physical: Physical) -> list[JsonObject]:
        """The inline policies' statements of the function's role (Fn::GetAtt [Role, Arn]).

        The managed policies SAM attaches (basic execution), and a role's policy named
        `lambda-service` (the dispatcher's: its log group, its stream and queue read by its
        event source mappings), grant what Lambda itself does as the role, none of the
        calls the function's own code makes through this harness.
        """
        if not (isinstance(role, dict) and "Fn::GetAtt" in role):
            return []
        role_id = role["Fn::GetAtt"][0]
        statements: list[JsonObject] = []
        for policy in self.properties(role_id).get("Policies", []):
            if policy.get("PolicyName") == LAMBDA_SERVICE_POLICY:
                continue
            listed = policy["PolicyDocument"]["Statement"]
            for statement in listed if isinstance(listed, list) else [listed]:
                statements.append(self.resolve(statement, physical))
        return statements

    def routes(self) -> list[Route]:
        """The HttpApi's routes, from the OpenAPI body the transform writes, each with its
        authorization (its `security`, conditions resolved with the parameters)."""
        found = []
        for api in self.of_type("AWS::ApiGatewayV2::Api"):
            body = self.properties(api).get("Body", {})
            schemes = body.get("components", {}).get("securitySchemes", {})
            sigv4 = {n for n, s in schemes.items() if s.get("x-amazon-apigateway-authtype") == "awsSigv4"}
            for path, methods in body.get("paths", {}).items():
                for method, operation in methods.items():
                    uri = operation.get("x-amazon-apigateway-integration", {}).get("uri", {})
                    sub = uri.get("Fn::Sub", "") if isinstance(uri, dict) else ""
                    target = re.search(r"\$\{(\w+)\.Arn\}", sub if isinstance(sub, str) else "")
                    if target is None:
                        continue
                    verb = "ANY" if method == "x-amazon-apigateway-any-method" else method.upper()
                    security = self.resolve(operation.get("security", []), Physical(stack_name="-")) or []
                    iam = any(name in sigv4 for requirement in security for name in requirement)
                    found.append(Route(verb, path, target.group(1), "AWS_IAM" if iam else "NONE"))
        return found

    def stream_mappings(self, physical: Physical) -> list[StreamMapping]:
        found = []
        for rid in self.of_type("AWS::Lambda::EventSourceMapping"):
            props = self.properties(rid)
            arn = props["EventSourceArn"]
            if not _getatt_of(arn, "StreamArn"):
                continue
            failure = props.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
            found.append(
                StreamMapping(
                    function=props["FunctionName"]["Ref"],
                    stream_arn=self.resolve(arn, physical),
                    batch_size=int(props.get("BatchSize", 100)),
                    starting_position=props.get("StartingPosition", "LATEST"),
                    maximum_retry_attempts=int(props.get("MaximumRetryAttempts", -1)),
                    bisect_on_error=bool(props.get("BisectBatchOnFunctionError", False)),
                    report_item_failures="ReportBatchItemFailures" in props.get("FunctionResponseTypes", []),
                    filters=_filters(props),
                    on_failure_queue_url=self._queue_url(failure, physical),
                )
            )
        return found

    def queue_mappings(self, physical: Physical) -> list[QueueMapping]:
        found = []
        for rid in self.of_type("AWS::Lambda::EventSourceMapping"):
            props = self.properties(rid)
            arn = props["EventSourceArn"]
            queue = _getatt_of(arn, "Arn")
            if queue is None or self.resources[queue]["Type"] != "AWS::SQS::Queue":
                continue
            found.append(
                QueueMapping(
                    function=props["FunctionName"]["Ref"],
                    queue_url=physical.refs[queue],
                    queue_arn=self.resolve(arn, physical),
                    batch_size=int(props.get("BatchSize", 10)),
                    report_item_failures="ReportBatchItemFailures" in props.get("FunctionResponseTypes", []),
                    filters=_filters(props),
                )
            )
        return found

    def _queue_url(self, arn: Any, physical: Physical) -> str | None:
        queue = _getatt_of(arn, "Arn") if arn is not None else None
        return physical.refs.get(queue) if queue else None


def _getatt_of(value: Any, attr: str) -> str | None:
    """The logical id in `{"Fn::GetAtt": [id, attr]}`, else None."""
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        target = value["Fn::GetAtt"]
        rid, got = target.split(".", 1) if isinstance(target, str) else target
        return str(rid) if got == attr else None
    return None


def _reserved(value: Any) -> int | None:
    """ReservedConcurrentExecutions as resolved: a number, or nothing (AWS::NoValue)."""
    if value is None or isinstance(value, dict):
        return None
    return int(value)


def _filters(props: JsonObject) -> list[JsonObject]:
    return [json.loads(f["Pattern"]) for f in props.get("FilterCriteria", {}).get("Filters", [])]


def _string(value: Any) -> str:
    """A value as CloudFormation passes it to a string property (numbers, booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ---- loading ---------------------------------------------------------------------------------
def load(path: Path, cache_dir: Path) -> Template:
    """Decodes and transforms `path`, or reads the result cached for its bytes."""
    source = path.read_bytes()
    tools = f"cfn-lint {version('cfn-lint')}, aws-sam-translator {version('aws-sam-translator')}"
    digest = hashlib.sha256(source + tools.encode()).hexdigest()[:16]
    cached = cache_dir / f"template-{digest}.json"
    if cached.exists():
        both = json.loads(cached.read_text())
        return Template(both["original"], both["transformed"])
    original, transformed = _decode_and_transform(path)
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(".tmp")
    partial.write_text(json.dumps({"original": original, "transformed": transformed}))
    partial.replace(cached)
    return Template(original, transformed)


def _decode_and_transform(path: Path) -> tuple[JsonObject, JsonObject]:
    # Imported here: about 6 s, paid only when the cache misses.
    import boto3
    from cfnlint.decode import cfn_yaml  # type: ignore[import-untyped]
    from samtranslator.parser.parser import Parser  # type: ignore[import-untyped]
    from samtranslator.translator.translator import Translator  # type: ignore[import-untyped]

    # Plain dicts (cfn-lint's nodes carry positions that json and deepcopy need not see).
    original: JsonObject = json.loads(json.dumps(cfn_yaml.load(str(path))))
    sam = json.loads(json.dumps(original))
    sam.get("Globals", {}).get("Function", {}).pop("CodeUri", None)
    for res in sam["Resources"].values():
        if res.get("Type") == "AWS::Serverless::Function":
            res.setdefault("Properties", {})["CodeUri"] = _DUMMY_CODE
    translator = Translator(None, Parser(), boto_session=boto3.session.Session(region_name=REGION))
    transformed: JsonObject = translator.translate(
        sam,
        parameter_values={"AWS::Region": REGION, "AWS::AccountId": ACCOUNT},
        get_managed_policy_map=dict,
    )
    return original, transformed
