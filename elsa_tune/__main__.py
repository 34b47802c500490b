from elsa_tune.tuner.cli import main

raise SystemExit(main())
