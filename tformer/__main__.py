import sys

from tformer.cli import main

sys.exit(main())
