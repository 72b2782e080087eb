import sys

from fp8mla.cli import main

sys.exit(main())
