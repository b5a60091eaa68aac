"""Run every benchmark script in bench/ in turn (``make bench``); each prints a markdown table."""

import subprocess
import sys
from pathlib import Path

if __name__ == "__main__":
    here = Path(__file__).parent
    for script in sorted(here.glob("bench_*.py")):
        print(f"\n# {script.name}\n", flush=True)
        subprocess.run([sys.executable, str(script)], check=True)
