from zoo.cli import main

main()
