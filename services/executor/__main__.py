from dispo.executor.app import main

main()
