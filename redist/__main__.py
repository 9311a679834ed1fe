import sys

from redist.cli import main

sys.exit(main())
