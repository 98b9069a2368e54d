from omnikeras.cli.main import main

main()
