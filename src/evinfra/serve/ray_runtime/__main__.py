from evinfra.serve.ray_runtime.server import main

raise SystemExit(main())
