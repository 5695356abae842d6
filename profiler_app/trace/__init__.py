"""``gpu-profiler trace``: why one job is slow, from an Nsight Systems SQLite export.

``export`` opens and checks the file (``.nsys-rep`` exported first when nsys is installed);
``events`` reads the event tables' columns in bulk (``columns``) and checks their rows;
``groups`` and ``timeline`` reduce them with numpy (``grouping``): kernels, copies and calls as
``nsys stats`` groups them, each GPU's busy time and idle gaps; ``queries`` holds the SQL for
names, NVTX ranges and GPUs; ``iterations`` finds the iteration period (NVTX ranges, else the
busy signal through ``profiler_app.analysis``); ``verdict`` applies the documented rules as pure
functions; ``summary`` assembles the per-GPU result and its JSON; ``render`` prints it. Nothing
here runs nsys to profile: reports come from the job's own container or from NVIDIA's Nsight
Operator (docs/trace.md).
"""
