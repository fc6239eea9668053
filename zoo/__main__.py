from zoo.entry import main

main()
