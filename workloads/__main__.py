"""`python -m workloads replay|scenario|policy-study ...`"""

import sys

from .cli import main

sys.exit(main())
