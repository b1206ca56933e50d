from dskbench.frontends.cli import main

raise SystemExit(main())
