from ecotrain.cli import main

raise SystemExit(main())
