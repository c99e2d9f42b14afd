"""``python -m databus.coordination secure``: put the project's ZooKeeper ACLs on an
existing tree (``_acl.secure_tree``; docs/clusters.md "ZooKeeper credentials and
ACLs")::

    python -m databus.coordination secure \\
        --zookeeper 'digest:databus:${ZK_PASSWORD}@zk1:2181,zk2:2181/databus' \\
        [--previous-env ZK_OLD_CREDENTIALS] [--keep-previous] [--sensitive PATH ...]

``--previous-env VAR``: an environment variable holding ``user:password`` of earlier
credentials (repeatable; never on the command line). Exit status 0, or 1 with one line
on stderr (never a password).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from databus._redact import install_log_redaction, redact
from databus.errors import ConfigError, DatabusError


def main(argv: Sequence[str] | None = None) -> int:
    from databus.coordination._acl import DEFAULT_SENSITIVE, secure_tree

    install_log_redaction()
    parser = argparse.ArgumentParser(prog="python -m databus.coordination")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    secure = actions.add_parser(
        "secure", help="give every node under /databus the ACL of its place")
    secure.add_argument("--zookeeper", required=True, metavar="CONNECT",
                        help="digest:user:${PASSWORD_VAR}@host:port[,...][/chroot]")
    secure.add_argument("--previous-env", action="append", default=[], metavar="VAR",
                        help="an environment variable holding user:password of earlier "
                             "credentials (repeatable)")
    secure.add_argument("--keep-previous", action="store_true",
                        help="keep the earlier credentials in every ACL (rotation, step 1)")
    secure.add_argument("--sensitive", action="append", default=[], metavar="PATH",
                        help="another subtree only the credentials may read (a checkpoint "
                             "store's root); /databus/groups and /databus/checkpoints are")
    secure.add_argument("--timeout", type=float, default=10.0, metavar="S")
    args = parser.parse_args(argv)
    try:
        previous = []
        for var in args.previous_env:
            value = os.environ.get(var)
            if not value:
                raise ConfigError(f"--previous-env {var}: the variable is not set")
            previous.append(value)
        done = secure_tree(args.zookeeper, previous=previous,
                           keep_previous=args.keep_previous,
                           sensitive=[*DEFAULT_SENSITIVE, *args.sensitive],
                           timeout=args.timeout)
    except DatabusError as exc:
        sys.stderr.write(redact(f"error: {exc.message}") + "\n")
        return 1
    print(f"set the ACL of {len(done.changed)} node(s); {done.unchanged} already had it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
