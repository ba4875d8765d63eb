"""Whose service account the deploy may take (rules/ownership.py, account_problem): one vllm-fleet
did not create (a person's, another daemon's, the OS's, a group with members) is never taken over;
its own, in its current or earlier form, or none, is fine."""

from __future__ import annotations


import pytest

from vllm_fleet import kinds
from vllm_fleet.operations import managed
from vllm_fleet.rules import ownership


# --- the service account: one vllm-fleet did not create is never taken over ------------------------

def _account(name="vllm", comment=managed.ACCOUNT_COMMENT, uid=999, home="/var/lib/vllm-fleet",
             shell="/usr/sbin/nologin", members=()):
    return {"user": {"name": name, "uid": uid, "gid": uid, "comment": comment, "home": home, "shell": shell,
                     "group": name}, "group": {"name": name, "gid": uid, "members": list(members)}}


@pytest.mark.parametrize("found, words", [
    (_account("nobody", comment="nobody", uid=65534, home="/nonexistent"), "uid 65534"),  # the OS's
    (_account("deploy", comment="Deploy,,,", uid=1000, home="/home/deploy", shell="/bin/bash"), "not created by"),
    (_account("prometheus", comment="Prometheus daemon", uid=105, home="/var/lib/prometheus"), "another daemon"),
    # No comment, but not what an earlier deploy made: a login shell, another home, a person's uid.
    (_account(comment="", shell="/bin/bash"), "not created by"),
    (_account(comment="", home="/home/vllm"), "not created by"),
    (_account(comment="", uid=1001), "not created by"),
    (_account(comment="\x1b]0;x\x07"), "(not shown)"),  # a terminal's escape is never printed
    ({"user": None, "group": {"name": "vllm", "gid": 50, "members": ["alice"]}}, "'alice'"),
])
def test_an_account_vllm_fleet_did_not_create_is_never_taken_over(found, words):
    """A person's, another daemon's or the OS's account (or a group with members) would share its files,
    processes and logins with the service, and the service's secrets with its owner."""
    user = found["user"]["name"] if found["user"] else "vllm"
    problem = ownership.account_problem(found, user, user, legacy_home="/var/lib/vllm-fleet")
    assert problem and words in problem and kinds.printable(problem), problem


@pytest.mark.parametrize("found", [
    {"user": None, "group": None},
    {"user": None, "group": {"name": "vllm", "gid": 50, "members": []}},
    _account(),
    _account(comment=""),  # the vLLM user an earlier deploy made: a system user of the state dir, no shell
])
def test_an_account_of_vllm_fleets_own_or_none_is_fine(found):
    assert ownership.account_problem(found, "vllm", "vllm", legacy_home="/var/lib/vllm-fleet") is None
    if found["user"] and found["user"]["comment"] == "":  # only the vLLM user's earlier form
        assert ownership.account_problem(found, "vllm", "vllm") is not None
