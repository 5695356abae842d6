"""``python -m infra.render``: every object a stack would create, without a cluster or Pulumi CLI.

    python -m infra.render stacks/eks                          # YAML stream on stdout
    python -m infra.render stacks/eks --out rendered/eks       # one file per object
    python -m infra.render stacks/kubeadm --config stacks/kubeadm/Pulumi.example.yaml --check
    python -m infra.render stacks/kubeadm --check --assume-storage-class ceph-rbd
    python -m infra.render --pull-charts                       # fill the chart cache (network)

The stack program runs under Pulumi's mock engine with the stack file's config; Helm releases are
rendered from the chart cache (``$GPU_CLUSTER_CHART_CACHE``). Values the cloud would compute (a
kubeconfig, generated passwords) are placeholders, and Secrets the program declares are written
with their values redacted. Exit status: 0, 1 when ``--check`` finds problems, 2 on bad input.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from infra.render import CHECK_NAMES

if TYPE_CHECKING:
    from infra.render.graph import ObjectGraph

DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's: CRDs are large
MARKER = ".gpu-cluster-render"  # marks a folder this command wrote, and may therefore replace
REDACTED = "<redacted: pulumi up sets it from the stack's secret config>"
UNSAFE_FILE_CHARACTERS = re.compile(r"[^A-Za-z0-9._-]+")


class UsageError(Exception):
    """Bad input, reported in one line."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m infra.render",
        description="Write every Kubernetes object a stack would create (Helm releases rendered "
        "with the real charts), for review or GitOps, and optionally check the whole graph.",
    )
    parser.add_argument("stack", nargs="?", type=Path, help="a stack folder, e.g. stacks/eks")
    parser.add_argument(
        "--config",
        type=Path,
        help="the stack's config file (default: Pulumi.example.yaml in the stack folder)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="write one YAML file per object under this folder (default: a YAML stream on stdout)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"check the object graph ({', '.join(CHECK_NAMES)}); exit 1 when anything is found",
    )
    parser.add_argument(
        "--assume-namespace",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="a namespace that exists in the cluster already (repeatable)",
    )
    parser.add_argument(
        "--assume-storage-class",
        action="append",
        default=[],
        metavar="CLASS",
        help="a StorageClass that exists in the cluster already (repeatable)",
    )
    parser.add_argument(
        "--pull-charts",
        action="store_true",
        help="first download the pinned charts the chart cache lacks (needs network)",
    )
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.stack is None and not args.pull_charts:
        parser.error("give a stack folder, or --pull-charts")
    return args


def _redacted(manifest: dict[str, Any]) -> dict[str, Any]:
    return {
        **manifest,
        **{
            key: dict.fromkeys(manifest[key], REDACTED)
            for key in ("data", "stringData")
            if isinstance(manifest.get(key), dict)
        },
    }


def _publishable(graph: ObjectGraph) -> list[tuple[str, dict[str, Any]]]:
    """``(relative file path, manifest)`` of every object; the program's own Secrets redacted."""
    files = []
    for obj in graph.objects:
        manifest = obj.manifest
        if obj.kind == "Secret" and not obj.source.startswith("helm/"):
            manifest = _redacted(manifest)
        leading: dict[str, Any] = {
            key: manifest[key] for key in ("apiVersion", "kind", "metadata") if key in manifest
        }
        manifest = {**leading, **manifest}
        name = UNSAFE_FILE_CHARACTERS.sub("_", f"{obj.kind}-{obj.name}")
        files.append((f"{obj.source}/{obj.namespace or '_cluster'}/{name}.yaml", manifest))
    return files


def write_folder(folder: Path, files: list[tuple[str, dict[str, Any]]]) -> None:
    """Replace ``folder`` with the files; refuses a non-empty folder this command did not write."""
    if folder.exists():
        if not folder.is_dir():
            raise UsageError(f"--out {folder} is not a folder")
        if any(folder.iterdir()) and not (folder / MARKER).exists():
            raise UsageError(
                f"--out {folder} holds files this command did not write; choose an empty folder"
            )
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / MARKER).write_text("Written by `python -m infra.render`; replaced on each run.\n")
    for relative, manifest in files:
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.dump(manifest, Dumper=DUMPER, sort_keys=False))


def _checked(
    graph: ObjectGraph, assumed_namespaces: frozenset[str], assumed_classes: frozenset[str]
) -> int:
    from infra.render.checks import run_checks  # noqa: PLC0415

    graph.platform.storage_classes |= assumed_classes
    findings = run_checks(graph, assumed_namespaces)
    count = 0
    for check, lines in findings.items():
        for line in lines:
            print(f"{check}: {line}")
            count += 1
    summary = f"{len(graph.objects)} objects on {graph.platform.name}, {len(findings)} checks"
    print(f"{count} problems found ({summary})" if count else f"all checks pass ({summary})")
    return 1 if count else 0


def _graph(args: argparse.Namespace) -> ObjectGraph | None:
    """The stack's object graph (None when only pulling charts); raises on bad input."""
    from infra import versions  # noqa: PLC0415
    from infra.render.charts import chart_cache, pull_charts  # noqa: PLC0415
    from infra.render.graph import build_graph  # noqa: PLC0415
    from infra.render.program import run_stack  # noqa: PLC0415

    if args.pull_charts:
        archives = pull_charts(versions.PINNED_CHARTS)
        print(
            f"chart cache {chart_cache()}: {', '.join(a.name for a in archives)}", file=sys.stderr
        )
    if args.stack is None:
        return None
    if not (args.stack / "Pulumi.yaml").is_file():
        raise UsageError(f"{args.stack} is not a stack folder (no Pulumi.yaml)")
    return build_graph(run_stack(args.stack, config_file=args.config))


# The pyproject extras that install what rendering needs: `render` brings Pulumi (`infra`) and
# the chart engine; the kubeadm stack also imports Ansible.
EXTRA_OF_MODULE = {"ansible": "render,ansible"}


def _missing(error: ImportError) -> int:
    """One line naming the missing module and the extra that installs it; exit status 2."""
    module = (error.name or "a module").partition(".")[0]
    extra = next(
        (extra for name, extra in EXTRA_OF_MODULE.items() if module.startswith(name)), "render"
    )
    print(f"render: error: {module} is missing: pip install -e '.[{extra}]'", file=sys.stderr)
    return 2


def _emit(args: argparse.Namespace, graph: ObjectGraph) -> None:
    """The rendered objects into --out, or onto stdout unless only --check was asked for."""
    files = _publishable(graph)
    if args.out is not None:
        write_folder(args.out, files)
        print(f"wrote {len(files)} objects to {args.out}", file=sys.stderr)
    elif not args.check:
        stream = (manifest for _, manifest in files)
        yaml.dump_all(stream, sys.stdout, Dumper=DUMPER, sort_keys=False)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    warnings.simplefilter("ignore", DeprecationWarning)  # pulumi-eks' import-time notices
    try:
        # Imported here so that `--help` and usage errors stay fast.
        import pulumi  # noqa: PLC0415

        from infra.kubeadm_inventory import InventoryError  # noqa: PLC0415
        from infra.render.charts import ChartError  # noqa: PLC0415
        from infra.render.program import StackFileError  # noqa: PLC0415
    except ImportError as error:
        return _missing(error)
    bad_input = (
        UsageError,
        ChartError,
        StackFileError,
        InventoryError,
        pulumi.RunError,
        ValueError,
    )
    try:
        graph = _graph(args)
        if graph is not None:
            _emit(args, graph)
    except BrokenPipeError:  # stdout piped into `head`
        sys.stderr.close()
        return 0
    except ModuleNotFoundError as error:  # an optional dependency the stack's program imports
        return _missing(error)
    except (*bad_input, OSError) as error:
        print(f"render: error: {error}", file=sys.stderr)
        return 2
    if graph is None or not args.check:
        return 0
    return _checked(graph, frozenset(args.assume_namespace), frozenset(args.assume_storage_class))


if __name__ == "__main__":
    sys.exit(main())
