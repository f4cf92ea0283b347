from neuron_migrate.cli.app import main

main()
