from controlplane.cli.main import main

main()
