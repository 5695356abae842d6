"""From series to one profile per GPU and its pods: timelines, exporter series, workloads,
engines, the profile builder and its terminal rendering."""
