from dispo.console.app import main

main()
