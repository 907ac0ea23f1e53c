from celeryops.launch import main

main()
