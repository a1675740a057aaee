"""Byte-compares the PNGs two flux-lite binaries write for the golden cases'
flags on one tier: the check that a change which should not move a pixel
(a fused pass, a new data path giving the same values) moves none.

    python3 ci/compare-pngs.py OLD_BINARY NEW_BINARY TIER [PREFIX...]

TIER is f32, f16 or matrix; PREFIX runs each binary under a wrapper, e.g.
`bash ci/lavapipe-sid.sh run` for the matrix tier on Mesa 26 (the binaries
and /tmp must then be inside what the root mounts). Prints one line a case
and the number that differ; exits 1 when any does.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'test_vectors')
CASES = ['tiny-a/one-step', 'tiny-a/four-step-wide', 'tiny-b/cfg', 'tiny-9b/two-step', 'tiny-a/reference-one',
         'tiny-a/reference-two', 'tiny-b/reference-cfg', 'tiny-9b-kv/reference-kv']


def flags(case, tier):
    c = json.load(open(f'{ROOT}/goldens/{case}/case.json'))
    args = ['gen', '--model', f"{ROOT}/models/{c['model']}", '--prompt', c['prompt'], '--seed', str(c['seed']),
            '--steps', str(c['steps'])]
    refs = [f"{ROOT}/goldens/{case}/{r['file']}" for r in c.get('references', [])]
    for r in refs:
        args += ['--image', r]
    if c.get('width_flag') is not None or not refs:
        args += ['--width', str(c['width']), '--height', str(c['height'])]
    return args + ['--precision', tier, '--quiet']


def main():
    old, new, tier, prefix = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    out_dir = tempfile.mkdtemp(prefix='compare-pngs-', dir='/tmp')
    differing = 0
    for case in CASES:
        digests = []
        for binary, tag in [(old, 'old'), (new, 'new')]:
            out = os.path.join(out_dir, f"{case.replace('/', '-')}-{tag}.png")
            run = subprocess.run(prefix + [binary] + flags(case, tier) + ['--output', out], capture_output=True, text=True)
            if run.returncode != 0:
                print(f'{case}: the {tag} binary failed: {run.stderr.strip()[-400:]}')
                digests.append(None)
                continue
            digests.append(hashlib.sha256(open(out, 'rb').read()).hexdigest())
        same = digests[0] is not None and digests[0] == digests[1]
        differing += not same
        print(f'{case} on {tier}: {"the same bytes" if same else "DIFFERENT"}')
    print(f'differing: {differing} of {len(CASES)}')
    sys.exit(1 if differing else 0)


if __name__ == '__main__':
    main()
