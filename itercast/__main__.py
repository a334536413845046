from itercast.cli import main

main()
