from profiler_app.cli import main

raise SystemExit(main())
