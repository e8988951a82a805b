from autotune.entry import main

if __name__ == "__main__":  # not when imported again, as multiprocessing's spawn start method imports the main module
    main()
