from dispo.executor.demo_downstream.app import main

main()
