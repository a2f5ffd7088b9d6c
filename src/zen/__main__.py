from zen.cli import main

main()
