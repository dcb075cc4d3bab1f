import sys

from ampe.cli import main

sys.exit(main())
