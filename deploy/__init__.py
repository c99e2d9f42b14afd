"""Example configs, ``spark-submit`` wrappers, service units and monitoring rules, shipped
in the package as ``databus.deploy`` (read them with ``importlib.resources``).

``init/`` holds the templates ``databus init`` fills in for a source."""
