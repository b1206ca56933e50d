from dskbench.cli import main

raise SystemExit(main())
