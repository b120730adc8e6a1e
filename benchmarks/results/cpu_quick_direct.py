"""``cpu_quick_paired.py`` with the CPU path's decodes summed directly as the device path's are
(``policy.direct_decode`` forced on) or not: whether the CPU would gain from them (issue 16,
sixteenth stop; it does not, ``check-issue16/cpu-quick-direct-16.txt``).

    python benchmarks/results/cpu_quick_direct.py product|direct
"""

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from pagedattn.oracle import policy  # noqa: E402

_direct = policy.direct_decode
if sys.argv[1] == "direct":
    policy.direct_decode = lambda c, query_lens, device_path: _direct(c, query_lens, True)
sys.argv = sys.argv[:1]
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_quick_paired.py"), run_name="__main__")
