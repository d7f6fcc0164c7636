from dispo.pool.app import main

main()
