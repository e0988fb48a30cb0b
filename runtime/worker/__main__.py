import sys

from runtime.worker.cli import main

sys.exit(main())
