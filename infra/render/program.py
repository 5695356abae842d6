"""Run a Pulumi program under Pulumi's mock engine and record the resource graph it declares.

The Pulumi CLI, its provider plugins and the cloud are not needed: the program runs against
``pulumi.runtime.Mocks`` (Pulumi's own unit-testing engine, ``preview=False`` so that every
``apply`` runs). Each registered resource is recorded with its inputs (wire names, camelCase), the
paths of the inputs that were marked secret on the wire, its parent and its dependencies. Remote
components (pulumi-eks's Cluster and ManagedNodeGroup) are single resources here: their inputs are
what is recorded. Outputs that only a cloud provider would compute (a kubeconfig, a generated
password) get fixed placeholder values.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import runpy
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from google.protobuf import json_format  # type: ignore[import-untyped]
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.proto import resource_pb2

from infra.chart_archive import charts_by_reference
from infra.stack_config import UNREADABLE_SECRET, declared_config

SECRET_SIG_KEY = "4dabf18193072939515e22adb298388d"  # noqa: S105  the engine's marker
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"  # noqa: S105

FAKE_KUBECONFIG = (
    "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1\n"
    "users:\n- name: u\n  user:\n    token: fake-token-not-a-secret\n"
)
FAKE_PASSWORD = "generated-password-0123456789abcd"  # noqa: S105  a mock's placeholder
# What pulumi_tls and the RDS CA bundle's command would produce: PEM-shaped placeholders.
FAKE_CERTIFICATE = (
    "-----BEGIN CERTIFICATE-----\nplaceholder: pulumi up sets the certificate\n"
    "-----END CERTIFICATE-----\n"
)
FAKE_PRIVATE_KEY = (
    "-----BEGIN EC PRIVATE KEY-----\nplaceholder: pulumi up generates the key\n"
    "-----END EC PRIVATE KEY-----\n"
)
RDS_CA_COMMAND = "-m infra.store.rds_ca"
FAKE_CLUSTER_SECURITY_GROUP = "sg-0123456789abcdef0"
FAKE_OIDC_PROVIDER = "oidc.eks.us-west-2.amazonaws.com/id/EXAMPLE0123456789"
FAKE_ACCOUNT_ID = "123456789012"
FAKE_CLUSTER_SECURITY_GROUP = "sg-0123456789abcdef0"
# Network cards of GPU instances with EFA (the EC2 API's MaximumNetworkCards), others: 1.
NETWORK_CARDS = {"p4d.24xlarge": 4, "p5.48xlarge": 32, "p5e.48xlarge": 32, "p5en.48xlarge": 16}
AVAILABILITY_ZONES = ["us-west-2a", "us-west-2b", "us-west-2c"]
# What `pulumi config set --secret` values become when the stack file holds them encrypted.
ENCRYPTED_PLACEHOLDER = UNREADABLE_SECRET


class StackFileError(ValueError):
    """A stack project or config file that cannot be read; the message says which and why."""


@dataclass
class Recorded:
    """One resource the program declared."""

    typ: str
    name: str
    inputs: dict[str, Any]
    secret_paths: set[str] = field(default_factory=set)
    parent: str = ""
    urn: str = ""
    dependencies: list[str] = field(default_factory=list)
    protect: bool = False  # Pulumi refuses to delete or replace it

    def get(self, path: str) -> Any:
        """The input at a dotted path (``spec.template.spec``); list items by index."""
        value: Any = self.inputs
        for part in path.split("."):
            value = value[int(part)] if isinstance(value, list) else value[part]
        return value


def integral_numbers(value: Any) -> Any:
    """Whole floats back to ints: the wire has only doubles, the API server's schema has ints."""
    if isinstance(value, dict):
        return {key: integral_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [integral_numbers(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _unwrap_secrets(value: Any) -> Any:
    """Plain values in place of the engine's ``{sig: secret, value: ...}`` wrappers."""
    if isinstance(value, dict):
        if value.get(SECRET_SIG_KEY) == SECRET_SIG:
            return _unwrap_secrets(value.get("value"))
        return {key: _unwrap_secrets(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unwrap_secrets(item) for item in value]
    return value


def _secret_paths(value: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(value, dict):
        if value.get(SECRET_SIG_KEY) == SECRET_SIG:
            yield prefix
            return
        for key, item in value.items():
            yield from _secret_paths(item, f"{prefix}.{key}" if prefix else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _secret_paths(item, f"{prefix}.{index}" if prefix else str(index))


def mock_id(typ: str, name: str) -> str:
    """The id a resource gets under the mocks: AWS-shaped for subnets, which a CRD's schema checks
    (Karpenter's EC2NodeClass selects subnets by id); ``<name>-id`` otherwise."""
    if typ == "aws:ec2/subnet:Subnet":
        return "subnet-" + hashlib.sha256(name.encode()).hexdigest()[:17]
    return f"{name}-id"


class RecordingMocks(pulumi.runtime.Mocks):
    """Echoes inputs as outputs, plus plausible values for the outputs programs read."""

    def __init__(self) -> None:
        self.resources: list[Recorded] = []
        self.calls: list[str] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        outputs = dict(args.inputs)
        if args.typ == "eks:index:Cluster":
            outputs["kubeconfigJson"] = FAKE_KUBECONFIG
            outputs["kubeconfig"] = {"apiVersion": "v1"}
            outputs["oidcProviderArn"] = (
                f"arn:aws:iam::{FAKE_ACCOUNT_ID}:oidc-provider/{FAKE_OIDC_PROVIDER}"
            )
            outputs["oidcProviderUrl"] = FAKE_OIDC_PROVIDER
            outputs["oidcIssuer"] = FAKE_OIDC_PROVIDER
            outputs["clusterSecurityGroupId"] = FAKE_CLUSTER_SECURITY_GROUP
        elif args.typ == "command:local:Command":
            fetches_ca = RDS_CA_COMMAND in str(args.inputs.get("create"))
            outputs["stdout"] = FAKE_CERTIFICATE if fetches_ca else FAKE_KUBECONFIG
            outputs["stderr"] = ""
        elif args.typ == "random:index/randomPassword:RandomPassword":
            outputs["result"] = FAKE_PASSWORD
        elif args.typ == "tls:index/privateKey:PrivateKey":
            outputs["privateKeyPem"] = FAKE_PRIVATE_KEY
        elif args.typ == "tls:index/selfSignedCert:SelfSignedCert":
            outputs["certPem"] = FAKE_CERTIFICATE
        elif args.typ == "aws:rds/instance:Instance":
            outputs["address"] = (
                f"{args.inputs.get('identifier')}.abcdefghijkl.us-west-2.rds.amazonaws.com"
            )
            outputs["masterUserSecrets"] = [
                {"secretArn": "arn:aws:secretsmanager:us-west-2:123456789012:secret:rds!db-0"}
            ]
            outputs.setdefault("arn", f"arn:aws:mock:::{args.name}")
        elif args.typ.startswith("aws:"):
            outputs.setdefault("arn", f"arn:aws:mock:::{args.name}")
        return mock_id(args.typ, args.name), outputs

    def call(
        self, args: pulumi.runtime.MockCallArgs
    ) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        self.calls.append(args.token)
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":  # noqa: S105
            zones = {"names": AVAILABILITY_ZONES, "zoneIds": ["usw2-az1", "usw2-az2", "usw2-az3"]}
            return zones, []
        if args.token == "aws:eks/getCluster:getCluster":  # noqa: S105
            vpc = {"clusterSecurityGroupId": FAKE_CLUSTER_SECURITY_GROUP}
            return {"name": args.args.get("name"), "vpcConfig": vpc}, []
        if args.token == "aws:ec2/getInstanceType:getInstanceType":  # noqa: S105
            name = str(args.args.get("instanceType"))
            cards = NETWORK_CARDS.get(name, 1)
            return {"instanceType": name, "maximumNetworkCards": cards, "efaSupported": True}, []
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":  # noqa: S105
            identity = {
                "accountId": FAKE_ACCOUNT_ID,
                "arn": f"arn:aws:iam::{FAKE_ACCOUNT_ID}:user/render",
                "userId": "AIDAEXAMPLE",
                "id": FAKE_ACCOUNT_ID,
            }
            return identity, []
        return {}, []


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """Records inputs, secret markers and dependencies; declines the resourceReferences feature.

    Without resource references, passing resources into remote components (the EKS cluster into a
    ManagedNodeGroup) no longer hangs under mocks (pulumi/pulumi#6561).
    """

    def __init__(self, mocks: RecordingMocks) -> None:
        super().__init__(mocks)
        self.recording_mocks = mocks

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802  the gRPC method's name
        response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
        if request.type != "pulumi:pulumi:Stack":
            wire = json_format.MessageToDict(request.object)
            inputs = self.resources[response.urn].state
            self.recording_mocks.resources.append(
                Recorded(
                    typ=request.type,
                    name=request.name,
                    inputs=_unwrap_secrets(dict(inputs)),
                    secret_paths=set(_secret_paths(wire)),
                    parent=request.parent,
                    urn=response.urn,
                    dependencies=list(request.dependencies),
                    protect=bool(request.protect),
                )
            )
        return response

    def SupportsFeature(self, request: Any) -> Any:  # noqa: N802
        supported = request.id not in ("outputValues", "resourceReferences")
        return type("SupportsFeatureResponse", (object,), {"hasSupport": supported})

    def GetDeploymentInfo(self, request: Any) -> Any:  # noqa: N802
        info = super().GetDeploymentInfo(request)  # type: ignore[no-untyped-call]
        features = [
            f
            for f in info.supportedFeatures
            if f != resource_pb2.RESOURCE_MONITOR_FEATURE_RESOURCE_REFERENCES
        ]
        return resource_pb2.DeploymentInfo(supportedFeatures=features)


@dataclass
class ProgramRun:
    """The resources a program declared and its stack outputs as ``(value, is_secret)``."""

    resources: list[Recorded]
    outputs: dict[str, tuple[Any, bool]]

    def of_type(self, typ: str) -> list[Recorded]:
        return [r for r in self.resources if r.typ == typ]

    def one(self, typ: str, name: str | None = None) -> Recorded:
        found = [r for r in self.of_type(typ) if name is None or r.name == name]
        if len(found) != 1:
            raise LookupError(f"expected one {typ} {name or ''}, found {[r.name for r in found]}")
        return found[0]

    def by_urn(self, urn: str) -> Recorded | None:
        """The resource with this URN; None for the stack itself, which is not recorded."""
        return next((r for r in self.resources if r.urn == urn), None)

    def kubernetes_resources(self) -> list[Recorded]:
        """Kubernetes objects declared directly (not Helm releases, not providers)."""
        return [
            r
            for r in self.resources
            if r.typ.startswith("kubernetes:")
            and not r.typ.startswith(("kubernetes:helm", "kubernetes:index:Provider"))
        ]

    def kubernetes_objects(self) -> list[dict[str, Any]]:
        """The manifests of :meth:`kubernetes_resources`."""
        return [integral_numbers(r.inputs) for r in self.kubernetes_resources()]

    def releases(self) -> list[Recorded]:
        return self.of_type("kubernetes:helm.sh/v3:Release")

    def release(self, chart: str) -> Recorded:
        found = [r for r in self.releases() if r.inputs["chart"] == chart]
        if len(found) != 1:
            raise LookupError(f"expected one release of {chart}, found {len(found)}")
        return found[0]


def run_program(
    program: Callable[[], object],
    project: str = "project",
    config: dict[str, str] | None = None,
    secret_keys: list[str] | None = None,
    *,
    verify_charts: bool = False,
) -> ProgramRun:
    """Run ``program`` under fresh mocks; returns what it declared and exported.

    Helm releases name their charts by repository and version (build_graph renders them from the
    chart cache), unless ``verify_charts``: then, as under `pulumi up`, by the path of the
    archive fetched into the chart cache and checked against its pin (infra/chart_archive.py).
    """
    mocks = RecordingMocks()
    pulumi_settings.ROOT.set(None)
    pulumi.runtime.set_mocks(
        mocks, project=project, stack="dev", preview=False, monitor=RecordingMonitor(mocks)
    )
    pulumi.runtime.set_all_config(config or {}, secret_keys or [])
    outputs: dict[str, tuple[Any, bool]] = {}

    async def read_outputs() -> None:
        root = pulumi_settings.get_root_resource()
        assert root is not None  # set by the mock engine
        for key, value in root.outputs.items():  # type: ignore[attr-defined]
            output = pulumi.Output.from_input(value)
            outputs[key] = (await output.future(), await output.is_secret())

    @pulumi.runtime.test  # type: ignore[untyped-decorator]
    def run() -> Any:
        program()
        return asyncio.ensure_future(read_outputs())

    with nullcontext() if verify_charts else charts_by_reference():
        run()
    return ProgramRun(resources=mocks.resources, outputs=outputs)


def _config_value(value: Any) -> str:
    # The engine passes structured config values as JSON text.
    return value if isinstance(value, str) else json.dumps(value)


def _yaml_file(path: Path) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise StackFileError(f"cannot read {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise StackFileError(f"{path} is not YAML: {error}") from None
    if not isinstance(document, dict):
        raise StackFileError(f"{path} must hold a YAML mapping")
    return document


def stack_config(
    stack_dir: Path, config_file: Path | None = None
) -> tuple[str, dict[str, str], list[str]]:
    """The project name, config and secret keys of a stack file, as the engine passes them.

    ``config_file`` defaults to the stack's ``Pulumi.example.yaml``. Values encrypted by
    ``pulumi config set --secret`` cannot be decrypted here: they become a placeholder secret.
    """
    project = _yaml_file(stack_dir / "Pulumi.yaml").get("name")
    if not isinstance(project, str):
        raise StackFileError(f"{stack_dir / 'Pulumi.yaml'} has no project name")
    path = config_file or stack_dir / "Pulumi.example.yaml"
    raw = _yaml_file(path).get("config") or {}
    if not isinstance(raw, dict):
        raise StackFileError(f"{path}: `config` must be a mapping")
    config: dict[str, str] = {}
    secret_keys: list[str] = []
    for key, value in raw.items():
        full_key = key if ":" in key else f"{project}:{key}"
        if isinstance(value, dict) and set(value) == {"secure"}:
            config[full_key] = ENCRYPTED_PLACEHOLDER
            secret_keys.append(full_key)
        else:
            config[full_key] = _config_value(value)
    return project, config, secret_keys


def _whole_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return True
    return isinstance(value, str) and value.strip().lstrip("+-").isdigit()


def _is_of_type(declaration: dict[str, Any], value: Any) -> bool:
    """Whether a value fits a ``Pulumi.yaml`` type, by the Pulumi CLI's rules: a whole number or
    its text for integer, true/false or their text for boolean, a list of fitting items for
    array. A setting without a type (a structured one) fits: the program checks it."""
    kind = declaration.get("type")
    checks = {
        "string": lambda: isinstance(value, str),
        "integer": lambda: _whole_number(value),
        "boolean": lambda: isinstance(value, bool) or value in ("true", "false"),
        "array": lambda: (
            isinstance(value, list)
            and all(_is_of_type(declaration.get("items") or {}, item) for item in value)
        ),
    }
    return checks[kind]() if kind in checks else True


def apply_project_config(
    stack_dir: Path, config: dict[str, str], secret_keys: list[str], stack_file: str
) -> None:
    """What the Pulumi CLI does with ``Pulumi.yaml``'s ``config:`` before it runs the program:
    the stack's values are checked against the declared types, and declared defaults fill the
    keys the stack leaves unset; a declared key with no default is required."""
    project = _yaml_file(stack_dir / "Pulumi.yaml").get("name")
    missing = []
    for key, declaration in declared_config(stack_dir / "Pulumi.yaml").items():
        full_key = f"{project}:{key}"
        if full_key in config:
            if full_key in secret_keys:
                continue  # encrypted: its value cannot be read here
            value = config[full_key]
            try:
                parsed = json.loads(value) if declaration.get("type") == "array" else value
            except json.JSONDecodeError:
                parsed = value
            if not _is_of_type(declaration, parsed):
                raise StackFileError(
                    f"{stack_file}: configuration key {key} must be of type "
                    f"{declaration['type']}, got {value!r}"
                )
        elif "default" in declaration or "value" in declaration:
            config[full_key] = _config_value(declaration.get("default", declaration.get("value")))
        else:
            missing.append(key)
    if missing:
        raise StackFileError(
            f"{stack_file}: the stack is missing configuration value(s) {', '.join(missing)}"
        )


def run_stack(
    stack_dir: Path,
    overrides: dict[str, Any] | None = None,
    secrets: dict[str, str] | None = None,
    config_file: Path | None = None,
    *,
    project_defaults: bool = True,
    verify_charts: bool = False,
) -> ProgramRun:
    """Run a stack's ``__main__.py`` with its config file (plus overrides) under mocks.

    An override of None removes the key; ``secrets`` are set as secret config values, as
    ``pulumi config set --secret`` does. Then, as the Pulumi CLI does, the values are checked
    against the types ``Pulumi.yaml`` declares and its defaults fill the unset keys (unless
    ``project_defaults`` is false: the program's own defaults then show).
    """
    project, config, secret_keys = stack_config(stack_dir, config_file)
    for key, value in (overrides or {}).items():
        full_key = key if ":" in key else f"{project}:{key}"
        if value is None:
            config.pop(full_key, None)
        else:
            config[full_key] = _config_value(value)
    for key, value in (secrets or {}).items():
        config[f"{project}:{key}"] = value
        secret_keys.append(f"{project}:{key}")
    if project_defaults:
        stack_file = (config_file or stack_dir / "Pulumi.example.yaml").name
        apply_project_config(stack_dir, config, secret_keys, stack_file)
    return run_program(
        lambda: runpy.run_path(str(stack_dir / "__main__.py"), run_name="__main__"),
        project=project,
        config=config,
        secret_keys=secret_keys,
        verify_charts=verify_charts,
    )
