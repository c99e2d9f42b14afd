#!/bin/sh
# Runs one databus Spark job (compact, seed or export) through spark-submit, on any
# master. docs/spark.md describes the jobs and their arguments.
#
#   deploy/spark-submit.sh compact --store 'postgresql://u:pw@db:5432/databus?schema=bootstrap'
#   SPARK_MASTER=spark://head:7077 deploy/spark-submit.sh export --store ... --source shop.orders --out s3://bucket/orders
#
# Environment:
#   SPARK_MASTER      master URL (default local[*])
#   SPARK_SUBMIT      the spark-submit to use (default: next to DATABUS_PYTHON, else PATH)
#   DATABUS_PYTHON    a Python with databus[spark] installed, on the driver and on every
#                     executor (default python3); the executors run it as their worker
#   DATABUS_JAVA_DIR  where the JDBC jars are (default /usr/share/java, Debian's
#                     libpostgresql-jdbc-java and libmariadb-java)
#   SPARK_SUBMIT_ARGS extra spark-submit arguments (--executor-memory 8g ...)
set -eu
if [ $# -lt 1 ]; then
    echo "usage: $0 compact|seed|export [job arguments]" >&2
    exit 2
fi
job=$1
shift
case $job in
    compact|export) jars=postgresql.jar ;;
    seed) jars=postgresql.jar,mariadb-java-client.jar ;;
    *) echo "$0: unknown job '$job' (compact, seed or export)" >&2; exit 2 ;;
esac
python=${DATABUS_PYTHON:-python3}
java_dir=${DATABUS_JAVA_DIR:-/usr/share/java}
script=$("$python" -c "import importlib.util as u; print(u.find_spec('databus.spark_jobs.$job').origin)")
submit=${SPARK_SUBMIT:-}
if [ -z "$submit" ]; then
    submit=$(dirname "$(command -v "$python")")/spark-submit
    [ -x "$submit" ] || submit=spark-submit
fi
jar_paths=$(echo "$jars" | sed "s#\([^,]*\)#$java_dir/\1#g")
# pip's spark-submit finds its Spark through this Python; workers run it too.
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$python}"
export PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$python}"
# shellcheck disable=SC2086  # SPARK_SUBMIT_ARGS is meant to split into words
exec "$submit" --master "${SPARK_MASTER:-local[*]}" --jars "$jar_paths" \
    --conf "spark.pyspark.python=$python" --conf "spark.pyspark.driver.python=$python" \
    ${SPARK_SUBMIT_ARGS:-} "$script" "$@"
