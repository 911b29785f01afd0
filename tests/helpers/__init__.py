"""What the tests share: real daemons, servers, disks, users and clients (never a test;
no test module is imported by another)."""
