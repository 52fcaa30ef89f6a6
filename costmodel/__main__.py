import sys

from costmodel.cli import main

sys.exit(main())
