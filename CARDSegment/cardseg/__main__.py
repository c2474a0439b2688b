from cardseg.cli import console_main

if __name__ == "__main__":  # not when a spawned worker process imports it as __mp_main__
    from cardseg.base.parent_watch import watch_parent_from_env

    watch_parent_from_env()  # a child of the Slicer module ends when the module's process is gone
    console_main()
