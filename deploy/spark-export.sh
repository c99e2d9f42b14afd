#!/bin/sh
# databus spark export through spark-submit (see deploy/spark-submit.sh for the environment).
exec "$(dirname "$0")/spark-submit.sh" export "$@"
