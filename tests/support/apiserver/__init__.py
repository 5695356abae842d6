"""A stand-in Kubernetes API server: a TEST DOUBLE for the calls the profiler makes.

No real kube-apiserver can run here, so this small HTTP server answers, over real HTTP on
127.0.0.1, the handful of requests ``profiler_app.core.kube``, ``sources.kube_pods`` and
``sinks.kubernetes`` send, shaped like the real API server's answers as kubernetes/kubernetes
at v1.35.0 gives them: each module cites the upstream file its behaviour follows
(``staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go``, ``staging/src/k8s.io/apimachinery/
pkg/apis/meta/v1/validation/validation.go``, ``pkg/api/errors/errors.go``, ...). By job:

- ``server``: ``StandInApiServer`` and ``running_apiserver``, the knobs tests turn (objects,
  watch history, injected faults, recorded requests, a kubeconfig);
- ``handler``: the HTTP requests: authentication, nodes and pods, lists, paging and watches;
- ``patches``: PATCH (strategic merge, merge, JSON patch, server-side apply) and what the real
  server refuses;
- ``state``: the stored objects and their history, shared by the request threads;
- ``objects``: ``Status`` objects and ``pod_manifest``.

Not modelled: TLS, label selectors, other resource kinds, admission, server-side apply's field
ownership, and JSON patch ``move`` and ``copy``.
"""
