from dispo.reconciler.app import main

main()
