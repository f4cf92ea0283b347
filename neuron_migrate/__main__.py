from neuron_migrate.cli.app import entry

entry()
