"""``gpu-profiler trace``: why one job is slow, from an Nsight Systems SQLite export.

``export`` opens and checks the file (``.nsys-rep`` exported first when nsys is installed);
``queries`` aggregates the events in SQL; ``iterations`` finds the iteration period (NVTX
ranges, else the kernel sequence through ``profiler_app.analysis``); ``verdict`` applies the
documented rules as pure functions; ``summary`` assembles the per-GPU result and its JSON;
``render`` prints it. Nothing here runs nsys to profile: reports come from the job's own
container or from NVIDIA's Nsight Operator (docs/trace.md).
"""
