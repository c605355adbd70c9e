#!/usr/bin/env bash
# A fresh team adopts alloc-audit, following the README's five steps on a
# copy of the demo engine: record today's sites and findings, install the
# pre-commit hook pinned to a release tag, see a new allocation blocked,
# accept it (the CI gate then fails: the allowlist grew), remove it (the gate
# passes). Run in CI by tests/test_fresh_team.py; exits non-zero at the first
# step that does not behave as the README says.
#
#   examples/fresh-team.sh WORKDIR [HOOK_REPO] [HOOK_REV]
#
# HOOK_REPO defaults to the project's home, HOOK_REV to v<installed version>;
# the test passes a tagged local clone. Needs alloc-audit, pre-commit and git.
set -euo pipefail

work="$1"
hook_repo="${2:-https://github.com/alloc-audit/alloc-audit}"
hook_rev="${3:-v$(alloc-audit --version | cut -d' ' -f2)}"
demo="$(cd "$(dirname "$0")" && pwd)/minigen"
export GIT_AUTHOR_NAME="${GIT_AUTHOR_NAME:-fresh team}" GIT_AUTHOR_EMAIL="${GIT_AUTHOR_EMAIL:-team@example.com}"
export GIT_COMMITTER_NAME="$GIT_AUTHOR_NAME" GIT_COMMITTER_EMAIL="$GIT_AUTHOR_EMAIL"

step() { printf '\n== %s\n' "$*"; }
expect_fail() { if "$@"; then echo "expected to fail: $*" >&2; exit 1; fi; }

step "a team's repository: the demo engine"
mkdir -p "$work/engine"
cd "$work/engine"
cp -r "$demo" minigen
printf '[tool.alloc-audit]\ninclude = ["minigen/**"]\n' > pyproject.toml
git init -q -b main
git add -A
git commit -qm "the engine"

step "README step 2: record today's sites and findings"
alloc-audit allowlist init
alloc-audit check
git add allowlists
git commit -qm "adopt alloc-audit"

step "README step 3: the hook, pinned to a release"
cat > .pre-commit-config.yaml <<EOF
repos:
  - repo: $hook_repo
    rev: $hook_rev
    hooks:
      - id: alloc-audit
EOF
pre-commit install
git add .pre-commit-config.yaml
git commit -qm "alloc-audit hook"

step "a commit adding an allocation is blocked"
git checkout -q -b feature
cp minigen/ops/attention.py "$work/attention.orig"
cat >> minigen/ops/attention.py <<'EOF'


def rotary_cache(n, dim):
    return torch.empty(n, dim, device="cuda")
EOF
git add minigen/ops/attention.py
expect_fail git commit -qm "rotary cache"

step "accepting it lets the commit through, and the gate fails: the allowlist grew"
alloc-audit allowlist update --add-new --reason "rotary cache, built once per model"
git add -A
git commit -qm "rotary cache"
expect_fail alloc-audit gate --base main

step "removing it: the gate passes"
cp "$work/attention.orig" minigen/ops/attention.py
alloc-audit allowlist update
git add -A
git commit -qm "no rotary cache after all"
alloc-audit gate --base main

step "the fresh team is set up"
