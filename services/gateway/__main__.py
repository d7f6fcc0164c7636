from dispo.gateway.app import main

main()
