from ecotrain.cli import main

raise SystemExit(main())  # main() itself ignores stop signals once the command is done (interpreter teardown)
