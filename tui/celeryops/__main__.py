from celeryops.cli import main

main()
