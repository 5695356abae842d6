"""``gpu-profiler unprotect``: remove every ``karpenter.sh/do-not-disrupt`` the profiler set.

Lists the pods of every node (or of ``--node``) once, in pages, and for each that carries the
profiler's marker reads it again and removes the profiler's annotations with a JSON patch that
tests what was read (``sinks.kubernetes.protection``): a do-not-disrupt anyone else set is never
touched. ``--dry-run`` only lists what it would change. Run it once protection is turned off or
the DaemonSet is gone (``pulumi destroy`` of the GpuProfiler component runs it).
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import TYPE_CHECKING

from profiler_app.commands import SUMMARIES, options
from profiler_app.core.annotations import DEFAULT_DOMAIN, validate_domain
from profiler_app.core.errors import UserError

if TYPE_CHECKING:  # the Kubernetes client is imported only once the arguments are good
    from profiler_app.sinks.kubernetes.protection import Released


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "unprotect",
        help=SUMMARIES["unprotect"],
        description="Remove karpenter.sh/do-not-disrupt and the profiler's marker from every pod "
        "where the profiler set them, e.g. once --protect-training is turned off or the "
        "DaemonSet is gone. A do-not-disrupt someone else set is left alone.",
    )
    group = parser.add_argument_group("unprotect")
    add = functools.partial(options.add_env_option, group)
    add(
        "--kubeconfig",
        env="KUBECONFIG",
        shown_default="the in-cluster service account when KUBERNETES_SERVICE_HOST is set",
        metavar="FILE",
        help="kubeconfig of the cluster",
    )
    add(
        "--annotation-domain",
        env="GPU_PROFILER_ANNOTATION_DOMAIN",
        default=DEFAULT_DOMAIN,
        metavar="DOMAIN",
        help="the domain of the profiler's marker, as the daemon was run with",
    )
    group.add_argument("--node", metavar="NAME", help="only the pods of this node")
    group.add_argument(
        "--dry-run", action="store_true", help="list what would change, and change nothing"
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    domain = validate_domain(args.annotation_domain)
    # The Kubernetes client takes a while to import: only once the arguments are good.
    from profiler_app.core import kube  # noqa: PLC0415
    from profiler_app.sinks.kubernetes import protection  # noqa: PLC0415
    from profiler_app.sources import kube_pods  # noqa: PLC0415

    connection = kube.connect(args.kubeconfig)
    if connection is None:
        raise UserError(
            "no cluster to talk to: give --kubeconfig FILE (or set KUBECONFIG), or run in a pod"
        )
    try:
        try:
            pods, _ = kube_pods.list_pods(
                connection,
                field_selector=f"spec.nodeName={args.node}" if args.node else None,
                annotation_keys=protection.watched_annotations(domain),
                max_pages=kube_pods.MAX_LIST_PAGES * 100,
            )
        except (kube_pods.ListExpiredError, kube_pods.ListPagingError) as error:
            raise UserError(
                f"cannot list the pods: {error or 'a continue token expired'}"
            ) from None
        except kube.TRANSPORT_ERRORS as error:
            raise UserError(f"cannot list the pods: {kube.describe(error)}") from None
        listed = sorted(pods.values(), key=lambda pod: (pod.namespace, pod.name))
        try:
            done = protection.release_all(
                connection,
                listed,
                domain=domain,
                dry_run=args.dry_run,
                report=functools.partial(_report, dry_run=args.dry_run),
            )
        except kube.TRANSPORT_ERRORS as error:
            raise UserError(f"cannot release the pods: {kube.describe(error)}") from None
    finally:
        connection.close()
    failed = sum(1 for released in done if released.error is not None)
    changed = sum(1 for released in done if released.change is not None and not released.error)
    if not done:
        print("no pod carries the profiler's marker")
    elif args.dry_run:
        print(f"{len(done)} pod(s) carry the profiler's marker; dry run: nothing changed")
    else:
        print(
            f"{len(done)} pod(s) carried the profiler's marker: {changed} released, {failed} failed"
        )
    return 1 if failed else 0


def _report(released: Released, *, dry_run: bool) -> None:
    from profiler_app.sinks.kubernetes.protection import Change  # noqa: PLC0415

    pod = released.pod
    where = f"{pod.namespace}/{pod.name} (node {pod.node or 'none'})"
    if released.error is not None:
        print(f"gpu-profiler: could not release {where}: {released.error}", file=sys.stderr)
        return
    if released.change is None:
        print(f"left {where}: it changed meanwhile and holds no mark of the profiler's any more")
        return
    what = (
        "karpenter.sh/do-not-disrupt and the marker"
        if released.change is Change.RELEASE
        else "the marker (the do-not-disrupt there is not the profiler's)"
    )
    verb = "would remove" if dry_run else "removed"
    print(f"{verb} {what} from {where}")
