from dispo.intelligence.app import main

main()
