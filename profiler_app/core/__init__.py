"""The data and primitives every layer uses: the profile model, errors, durations, URLs,
paths, arrays, back-off, annotations and the Kubernetes client's setup."""
