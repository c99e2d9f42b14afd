#!/bin/sh
# databus spark seed through spark-submit (see deploy/spark-submit.sh for the environment).
exec "$(dirname "$0")/spark-submit.sh" seed "$@"
